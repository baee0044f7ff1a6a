//! DDP-style gradient reducer (PyTorch `c10d/reducer.cpp`, spec runtime.md §2).
//!
//! - Buckets are filled in *reverse* parameter order (gradients become ready roughly from the
//!   last layer back), the first up to [`ReducerOptions::first_bucket_bytes`] (1 MiB), the rest up
//!   to [`ReducerOptions::bucket_cap_bytes`] (25 MiB), as `_compute_bucket_assignment_by_size`.
//! - [`Reducer::mark_ready`] counts a bucket down; a full bucket is handed to the communication
//!   thread **strictly in bucket order** ("ignore this bucket if it's not its turn"), so every rank
//!   issues the same collective sequence while the caller keeps computing the rest of backward.
//! - Buckets are all-reduced with [`ReduceOp::Avg`] (sum, then divide by the world size).
//! - `set_require_sync(false)` is `no_sync()`: gradients accumulate in the buckets and the next
//!   synced step reduces the sum.
//! - [`Reducer::sync_all`] is the path for frameworks without per-parameter hooks (candle): copy a
//!   bucket in, launch it, copy the next in while the previous one is on the wire.
//! - Construction checks that every rank registered the same parameter sizes (all-gather of a
//!   hash), and [`Reducer::broadcast_params`] copies rank 0's parameters everywhere.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::elem::{Element, ReduceOp};
use super::error::{Result, RuntimeError};
use super::group::ProcessGroup;
use super::shm::fnv1a;

/// Bucket sizes, as PyTorch's `bucket_cap_mb` and the 1 MiB first bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducerOptions {
    pub first_bucket_bytes: usize,
    pub bucket_cap_bytes: usize,
}

impl Default for ReducerOptions {
    fn default() -> Self {
        ReducerOptions {
            first_bucket_bytes: 1024 * 1024,
            bucket_cap_bytes: 25 * 1024 * 1024,
        }
    }
}

/// Groups parameters (given by element count) into buckets, walking them in reverse order; a
/// bucket closes as soon as it reaches its byte limit. Returns parameter indices per bucket.
pub fn assign_buckets(
    numels: &[usize],
    elem_bytes: usize,
    opts: ReducerOptions,
) -> Vec<Vec<usize>> {
    let mut buckets = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = 0usize;
    for i in (0..numels.len()).rev() {
        cur.push(i);
        bytes += numels[i] * elem_bytes;
        let limit = if buckets.is_empty() {
            opts.first_bucket_bytes
        } else {
            opts.bucket_cap_bytes
        };
        if bytes >= limit {
            buckets.push(std::mem::take(&mut cur));
            bytes = 0;
        }
    }
    if !cur.is_empty() {
        buckets.push(cur);
    }
    buckets
}

/// What the reducer did, in order (tests check ordering and overlap with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReducerEvent {
    /// The caller marked parameter i ready.
    Ready(usize),
    /// Bucket b was handed to the communication thread.
    Launch(usize),
    /// Bucket b's all-reduce finished.
    Done(usize),
}

type Bucket<T> = Arc<Mutex<Vec<T>>>;

/// The reducer for parameters of one element type.
pub struct Reducer<T: Element> {
    group: Arc<ProcessGroup>,
    numels: Vec<usize>,
    buckets: Vec<Vec<usize>>,
    /// Per parameter: (bucket, offset in the bucket).
    place: Vec<(usize, usize)>,
    data: Vec<Bucket<T>>,
    pending: Vec<usize>,
    ready: Vec<bool>,
    next_launch: usize,
    results: Vec<Option<Result<()>>>,
    require_sync: bool,
    events: Arc<Mutex<Vec<ReducerEvent>>>,
    jobs: Option<Sender<usize>>,
    done: Receiver<(usize, Result<()>)>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Element> Reducer<T> {
    /// Builds buckets and starts the communication thread. Collective: every rank must call it
    /// with the same sizes (checked).
    pub fn new(group: Arc<ProcessGroup>, numels: &[usize], opts: ReducerOptions) -> Result<Self> {
        let rank = group.rank();
        let mut sig = Vec::with_capacity(numels.len() * 8 + 8);
        sig.extend_from_slice(&(T::DTYPE.size() as u64).to_le_bytes());
        for n in numels {
            sig.extend_from_slice(&(*n as u64).to_le_bytes());
        }
        let mine = [fnv1a(&sig) as i64];
        let mut all = vec![0i64; group.world_size()];
        group.all_gather(&mine, &mut all)?;
        if let Some(bad) = all.iter().position(|h| *h != mine[0]) {
            return Err(RuntimeError::Invalid {
                rank,
                op: "reducer",
                msg: format!(
                    "rank {bad} registered different parameter sizes or dtype than this rank"
                ),
            });
        }
        let buckets = assign_buckets(numels, std::mem::size_of::<T>(), opts);
        let mut place = vec![(0, 0); numels.len()];
        let mut data = Vec::new();
        for (b, params) in buckets.iter().enumerate() {
            let mut off = 0;
            for &p in params {
                place[p] = (b, off);
                off += numels[p];
            }
            data.push(Arc::new(Mutex::new(vec![T::zeroed(); off])));
        }
        let (jobs, job_rx) = channel::<usize>();
        let (done_tx, done) = channel();
        let events = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (group, data, events) = (group.clone(), data.clone(), events.clone());
            std::thread::Builder::new()
                .name(format!("rdrun-ddp-comm-{rank}"))
                .spawn(move || comm_thread(group, data, events, job_rx, done_tx))
                .map_err(|e| RuntimeError::Io {
                    rank,
                    op: "reducer",
                    msg: format!("spawn the communication thread: {e}"),
                })?
        };
        let pending = buckets.iter().map(|b| b.len()).collect();
        let nb = buckets.len();
        Ok(Reducer {
            group,
            numels: numels.to_vec(),
            buckets,
            place,
            data,
            pending,
            ready: vec![false; numels.len()],
            next_launch: 0,
            results: (0..nb).map(|_| None).collect(),
            require_sync: true,
            events,
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Parameter indices per bucket, in launch order.
    pub fn buckets(&self) -> &[Vec<usize>] {
        &self.buckets
    }

    /// The event log so far (drained).
    pub fn take_events(&self) -> Vec<ReducerEvent> {
        std::mem::take(&mut *self.events.lock().expect("event log"))
    }

    /// `no_sync()`: with `false`, marks and syncs accumulate locally without communicating.
    pub fn set_require_sync(&mut self, on: bool) {
        self.require_sync = on;
    }

    fn invalid(&self, msg: String) -> RuntimeError {
        RuntimeError::Invalid {
            rank: self.group.rank(),
            op: "reducer",
            msg,
        }
    }

    fn check_param(&self, i: usize, len: usize) -> Result<()> {
        if i >= self.numels.len() {
            return Err(self.invalid(format!("parameter {i} does not exist")));
        }
        if len != self.numels[i] {
            return Err(self.invalid(format!(
                "gradient {i} has {len} elements, registered {}",
                self.numels[i]
            )));
        }
        Ok(())
    }

    /// Copies rank 0's parameters into every rank's `params` (mandatory before step 0 when ranks
    /// initialise differently).
    pub fn broadcast_params(&self, params: &mut [&mut [T]]) -> Result<()> {
        let mut flat: Vec<T> = params.iter().flat_map(|p| p.iter().copied()).collect();
        self.group.broadcast(&mut flat, 0)?;
        let mut off = 0;
        for p in params.iter_mut() {
            let n = p.len();
            p.copy_from_slice(&flat[off..off + n]);
            off += n;
        }
        Ok(())
    }

    /// Overwrites parameter `i`'s gradient in its bucket.
    pub fn set_grad(&mut self, i: usize, grad: &[T]) -> Result<()> {
        self.check_param(i, grad.len())?;
        let (b, off) = self.place[i];
        self.data[b].lock().expect("bucket")[off..off + grad.len()].copy_from_slice(grad);
        Ok(())
    }

    /// Adds into parameter `i`'s gradient in its bucket (accumulation under `no_sync`).
    pub fn add_grad(&mut self, i: usize, grad: &[T]) -> Result<()> {
        self.check_param(i, grad.len())?;
        let (b, off) = self.place[i];
        let mut d = self.data[b].lock().expect("bucket");
        T::reduce(&mut d[off..off + grad.len()], grad, ReduceOp::Sum);
        Ok(())
    }

    /// Copies parameter `i`'s (reduced, after [`Reducer::finish`]) gradient out.
    pub fn grad(&self, i: usize) -> Vec<T> {
        let (b, off) = self.place[i];
        self.data[b].lock().expect("bucket")[off..off + self.numels[i]].to_vec()
    }

    /// Zeroes every bucket (start of a new accumulation).
    pub fn zero_grads(&mut self) {
        for d in &self.data {
            d.lock().expect("bucket").fill(T::zeroed());
        }
    }

    /// Marks parameter `i`'s gradient final for this step; launches every bucket that is now
    /// complete and next in order.
    pub fn mark_ready(&mut self, i: usize) -> Result<()> {
        if i >= self.numels.len() {
            return Err(self.invalid(format!("parameter {i} does not exist")));
        }
        if !self.require_sync {
            return Ok(());
        }
        if self.ready[i] {
            return Err(self.invalid(format!("parameter {i} was marked ready twice in one step")));
        }
        self.ready[i] = true;
        self.events
            .lock()
            .expect("event log")
            .push(ReducerEvent::Ready(i));
        let (b, _) = self.place[i];
        self.pending[b] -= 1;
        while self.next_launch < self.buckets.len() && self.pending[self.next_launch] == 0 {
            self.events
                .lock()
                .expect("event log")
                .push(ReducerEvent::Launch(self.next_launch));
            self.jobs
                .as_ref()
                .expect("invariant: sender lives until drop")
                .send(self.next_launch)
                .map_err(|_| self.invalid("the communication thread has exited".into()))?;
            self.next_launch += 1;
        }
        Ok(())
    }

    /// Blocks until bucket `b`'s all-reduce has finished (it must have been launched).
    pub fn wait_bucket(&mut self, b: usize) -> Result<()> {
        if b >= self.next_launch {
            return Err(self.invalid(format!("bucket {b} was not launched")));
        }
        while self.results[b].is_none() {
            let (k, r) = self
                .done
                .recv()
                .map_err(|_| self.invalid("the communication thread has exited".into()))?;
            self.results[k] = Some(r);
        }
        match &self.results[b] {
            Some(Err(e)) => Err(self.invalid(format!("bucket {b}: {e}"))),
            _ => Ok(()),
        }
    }

    /// Waits for every bucket of this step and resets for the next one. Errors if a parameter
    /// was never marked ready (as DDP's "Expected to have finished reduction").
    pub fn finish(&mut self) -> Result<()> {
        if !self.require_sync {
            return Ok(());
        }
        let missing: Vec<usize> = (0..self.ready.len()).filter(|i| !self.ready[*i]).collect();
        let mut first_err = None;
        for b in 0..self.next_launch {
            while self.results[b].is_none() {
                match self.done.recv() {
                    Ok((k, r)) => self.results[k] = Some(r),
                    Err(_) => {
                        return Err(self.invalid("the communication thread has exited".into()))
                    }
                }
            }
            if let Some(Err(e)) = self.results[b].take() {
                first_err.get_or_insert(e);
            }
        }
        self.results.iter_mut().for_each(|r| *r = None);
        self.ready.iter_mut().for_each(|r| *r = false);
        self.pending = self.buckets.iter().map(|b| b.len()).collect();
        self.next_launch = 0;
        if let Some(e) = first_err {
            return Err(e);
        }
        if !missing.is_empty() {
            return Err(self.invalid(format!(
                "parameters {missing:?} were never marked ready; the step's reduction is incomplete"
            )));
        }
        Ok(())
    }

    /// The hook-less path: adds `grads` into the buckets (bucket by bucket, launching each as
    /// soon as it is filled), then, when syncing, writes the averaged gradients back and zeroes
    /// the buckets. Under `no_sync` the grads stay local and keep accumulating.
    pub fn sync_all(&mut self, grads: &mut [&mut [T]]) -> Result<()> {
        if grads.len() != self.numels.len() {
            return Err(self.invalid(format!(
                "sync_all got {} gradients, registered {}",
                grads.len(),
                self.numels.len()
            )));
        }
        for b in 0..self.buckets.len() {
            for k in 0..self.buckets[b].len() {
                let p = self.buckets[b][k];
                self.add_grad(p, grads[p])?;
            }
            for k in 0..self.buckets[b].len() {
                let p = self.buckets[b][k];
                self.mark_ready(p)?;
            }
        }
        if !self.require_sync {
            return Ok(());
        }
        self.finish()?;
        for (i, g) in grads.iter_mut().enumerate() {
            let (b, off) = self.place[i];
            g.copy_from_slice(&self.data[b].lock().expect("bucket")[off..off + self.numels[i]]);
        }
        self.zero_grads();
        Ok(())
    }
}

fn comm_thread<T: Element>(
    group: Arc<ProcessGroup>,
    data: Vec<Bucket<T>>,
    events: Arc<Mutex<Vec<ReducerEvent>>>,
    jobs: Receiver<usize>,
    done: Sender<(usize, Result<()>)>,
) {
    while let Ok(b) = jobs.recv() {
        let r = match data[b].lock() {
            Ok(mut d) => group.all_reduce(&mut d, ReduceOp::Avg),
            Err(_) => Err(RuntimeError::Invalid {
                rank: group.rank(),
                op: "reducer",
                msg: "bucket lock poisoned".into(),
            }),
        };
        if let Ok(mut ev) = events.lock() {
            ev.push(ReducerEvent::Done(b));
        }
        if done.send((b, r)).is_err() {
            break;
        }
    }
}

impl<T: Element> Drop for Reducer<T> {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::run_world;
    use crate::runtime::BackendChoice;
    use std::time::Duration;

    #[test]
    fn bucket_assignment_table() {
        let o = ReducerOptions {
            first_bucket_bytes: 8,
            bucket_cap_bytes: 16,
        };
        // 4-byte elements; reverse order; first bucket closes at >= 8 bytes, others at >= 16.
        assert_eq!(
            assign_buckets(&[1, 1, 1, 2, 1, 3], 4, o),
            vec![vec![5], vec![4, 3, 2], vec![1, 0]]
        );
        assert_eq!(assign_buckets(&[], 4, o), Vec::<Vec<usize>>::new());
        assert_eq!(assign_buckets(&[100], 4, o), vec![vec![0]]);
        let d = ReducerOptions::default();
        assert_eq!(
            (d.first_bucket_bytes, d.bucket_cap_bytes),
            (1 << 20, 25 << 20)
        );
        // 1 MiB of f32 = 262144 elements.
        assert_eq!(
            assign_buckets(&[262_144, 10, 262_144], 4, d),
            vec![vec![2], vec![1, 0]]
        );
    }

    fn opts() -> ReducerOptions {
        ReducerOptions {
            first_bucket_bytes: 4000,
            bucket_cap_bytes: 4000,
        }
    }

    #[test]
    fn launches_in_order_and_overlaps() {
        let outs = run_world(2, BackendChoice::Tcp, 4096, Duration::from_secs(60), |pg| {
            let r = pg.rank();
            let mut red = Reducer::<f32>::new(Arc::new(pg), &[1000, 1000, 1000, 1000], opts())
                .expect("reducer");
            assert_eq!(red.buckets(), &[vec![3], vec![2], vec![1], vec![0]]);
            // Step 1, reverse order: bucket 0 finishes before the rest of "backward" runs.
            for p in 0..4 {
                red.set_grad(p, &vec![(r + p) as f32; 1000]).unwrap();
            }
            red.mark_ready(3).unwrap();
            red.wait_bucket(0)
                .expect("bucket 0 reduced while backward continues");
            for p in [2, 1, 0] {
                red.mark_ready(p).unwrap();
            }
            red.finish().unwrap();
            let ev1 = red.take_events();
            let g: Vec<f32> = (0..4).map(|p| red.grad(p)[999]).collect();
            // Step 2, forward order: nothing launches until bucket 0's parameter (3) is ready.
            red.mark_ready(0).unwrap();
            red.mark_ready(1).unwrap();
            let before = red.take_events();
            red.mark_ready(2).unwrap();
            red.mark_ready(3).unwrap();
            red.finish().unwrap();
            let ev2 = red.take_events();
            (ev1, g, before, ev2)
        });
        for (ev1, g, before, ev2) in outs {
            assert_eq!(
                &ev1[..3],
                &[
                    ReducerEvent::Ready(3),
                    ReducerEvent::Launch(0),
                    ReducerEvent::Done(0)
                ]
            );
            assert!(
                ev1.iter()
                    .position(|e| *e == ReducerEvent::Done(0))
                    .unwrap()
                    < ev1
                        .iter()
                        .position(|e| *e == ReducerEvent::Ready(2))
                        .unwrap()
            );
            assert_eq!(g, vec![0.5, 1.5, 2.5, 3.5]);
            assert!(!before.iter().any(|e| matches!(e, ReducerEvent::Launch(_))));
            let launches: Vec<_> = ev2
                .iter()
                .filter_map(|e| match e {
                    ReducerEvent::Launch(b) => Some(*b),
                    _ => None,
                })
                .collect();
            assert_eq!(launches, vec![0, 1, 2, 3]);
        }
    }

    #[test]
    fn sync_all_no_sync_and_errors() {
        let outs = run_world(3, BackendChoice::Shm, 4096, Duration::from_secs(60), |pg| {
            let r = pg.rank() as f64;
            let pg = Arc::new(pg);
            let mut red = Reducer::<f64>::new(pg.clone(), &[3, 5, 2], opts()).expect("reducer");
            // Parameters differ per rank until broadcast.
            let mut p0 = vec![r; 3];
            let mut p1 = vec![r + 10.0; 5];
            let mut p2 = vec![r + 20.0; 2];
            red.broadcast_params(&mut [&mut p0, &mut p1, &mut p2])
                .unwrap();
            assert_eq!((p0[0], p1[0], p2[1]), (0.0, 10.0, 20.0));
            // Two accumulation micro-steps then a synced one: mean over ranks of the sums.
            red.set_require_sync(false);
            for _ in 0..2 {
                let (mut a, mut b, mut c) = (vec![r; 3], vec![1.0; 5], vec![2.0 * r; 2]);
                red.sync_all(&mut [&mut a, &mut b, &mut c]).unwrap();
                assert_eq!(a, vec![r; 3], "no_sync leaves local grads alone");
            }
            red.set_require_sync(true);
            let (mut a, mut b, mut c) = (vec![r; 3], vec![1.0; 5], vec![2.0 * r; 2]);
            red.sync_all(&mut [&mut a, &mut b, &mut c]).unwrap();
            let e1 = red.mark_ready(9).unwrap_err().to_string();
            red.mark_ready(0).unwrap();
            let e2 = red.mark_ready(0).unwrap_err().to_string();
            let e3 = red.finish().unwrap_err().to_string();
            (a, b, c, e1, e2, e3)
        });
        for (a, b, c, e1, e2, e3) in outs {
            // Sum over 3 micro-steps of r, mean over r in {0,1,2}: 3 * 1 = 3.
            assert_eq!(a, vec![3.0; 3]);
            assert_eq!(b, vec![3.0; 5]);
            assert_eq!(c, vec![6.0; 2]);
            assert!(e1.contains("parameter 9 does not exist"), "{e1}");
            assert!(e2.contains("twice"), "{e2}");
            assert!(e3.contains("never marked ready"), "{e3}");
        }
    }

    #[test]
    fn mismatched_registration_is_an_error() {
        let outs = run_world(2, BackendChoice::Tcp, 4096, Duration::from_secs(60), |pg| {
            let sizes: &[usize] = if pg.rank() == 0 { &[3, 4] } else { &[3, 5] };
            Reducer::<f32>::new(Arc::new(pg), sizes, ReducerOptions::default())
                .err()
                .map(|e| e.to_string())
        });
        for e in outs {
            assert!(e.expect("error").contains("different parameter sizes"));
        }
    }
}
