//! In-process tests of every collective: each rank is a thread with its own group, all sharing a
//! [`MemStore`]; results are compared with a sequential reference and across ranks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::*;

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A rank's fake host identity (None = this machine's).
type HostOf = fn(usize) -> Option<String>;

/// Runs `f` on `n` ranks (threads) of a fresh group and returns their results in rank order.
/// Panics (fails the test) if any rank does not finish within `bound`.
pub(crate) fn run_world<R, F>(
    n: usize,
    backend: BackendChoice,
    slot: usize,
    bound: Duration,
    f: F,
) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(ProcessGroup) -> R + Send + Sync + Clone + 'static,
{
    run_world_hosts(n, backend, slot, bound, |_| None, f)
}

/// [`run_world`] with a per-rank host identity (None = this machine's).
pub(crate) fn run_world_hosts<R, F>(
    n: usize,
    backend: BackendChoice,
    slot: usize,
    bound: Duration,
    host: HostOf,
    f: F,
) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(ProcessGroup) -> R + Send + Sync + Clone + 'static,
{
    let run = format!(
        "t{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let store = MemStore::new();
    let (tx, rx) = mpsc::channel();
    for r in 0..n {
        let (store, f, tx, run) = (store.clone(), f.clone(), tx.clone(), run.clone());
        std::thread::spawn(move || {
            let mut o = GroupOptions::new(r, n, &run);
            o.backend = backend;
            o.timeout = Duration::from_secs(30);
            o.shm_slot_bytes = slot;
            o.host_id = host(r);
            let pg = ProcessGroup::new(&store, &o).expect("group init");
            let _ = tx.send((r, f(pg)));
        });
    }
    drop(tx);
    let deadline = Instant::now() + bound;
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        let (r, v) = rx
            .recv_timeout(left)
            .expect("every rank finishes within the bound (a rank panicked or hung)");
        out[r] = Some(v);
    }
    out.into_iter().map(|v| v.expect("all ranks")).collect()
}

trait TestVal: Element {
    fn from_i(i: i64) -> Self;
}
impl TestVal for f32 {
    fn from_i(i: i64) -> Self {
        i as f32
    }
}
impl TestVal for f64 {
    fn from_i(i: i64) -> Self {
        i as f64
    }
}
impl TestVal for i32 {
    fn from_i(i: i64) -> Self {
        i as i32
    }
}
impl TestVal for i64 {
    fn from_i(i: i64) -> Self {
        i
    }
}
impl TestVal for f16 {
    fn from_i(i: i64) -> Self {
        f16::from_f32(i as f32)
    }
}
impl TestVal for bf16 {
    fn from_i(i: i64) -> Self {
        bf16::from_f32(i as f32)
    }
}

/// Small integers: exact in every dtype, so any summation order gives the reference exactly.
fn input<T: TestVal>(rank: usize, len: usize, salt: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_i(((rank * 7 + i * 3 + salt) % 11) as i64 - 5))
        .collect()
}

fn reference<T: TestVal>(n: usize, len: usize, salt: usize, op: ReduceOp) -> Vec<T> {
    let mut acc = input::<T>(0, len, salt);
    for r in 1..n {
        T::reduce(&mut acc, &input::<T>(r, len, salt), op);
    }
    if op == ReduceOp::Avg {
        T::div(&mut acc, n);
    }
    acc
}

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

fn check_dtype<T: TestVal>(pg: &ProcessGroup, sizes: &[usize]) -> usize {
    let (n, r) = (pg.world_size(), pg.rank());
    let mut checks = 0;
    for &len in sizes {
        for (k, op) in OPS.iter().enumerate() {
            let mut buf = input::<T>(r, len, k);
            pg.all_reduce(&mut buf, *op).expect("all_reduce");
            assert_eq!(
                buf,
                reference::<T>(n, len, k, *op),
                "all_reduce {:?} {op:?} len {len} n {n}",
                T::DTYPE
            );
            checks += 1;
            let mut out = vec![T::from_i(0); len];
            let send: Vec<T> = (0..n).flat_map(|j| input::<T>(r, len, k + j)).collect();
            pg.reduce_scatter(&send, &mut out, *op)
                .expect("reduce_scatter");
            assert_eq!(
                out,
                reference::<T>(n, len, k + r, *op),
                "reduce_scatter {:?} {op:?} len {len}",
                T::DTYPE
            );
            checks += 1;
        }
        for root in 0..n {
            let mut b = if r == root {
                input::<T>(root, len, 9)
            } else {
                vec![T::from_i(0); len]
            };
            pg.broadcast(&mut b, root).expect("broadcast");
            assert_eq!(
                b,
                input::<T>(root, len, 9),
                "broadcast root {root} len {len}"
            );
            checks += 1;
        }
        let mut g = vec![T::from_i(0); len * n];
        pg.all_gather(&input::<T>(r, len, 3), &mut g)
            .expect("all_gather");
        let want: Vec<T> = (0..n).flat_map(|j| input::<T>(j, len, 3)).collect();
        assert_eq!(g, want, "all_gather len {len}");
        checks += 1;
    }
    pg.barrier().expect("barrier");
    checks
}

fn matrix(backend: BackendChoice, n: usize) {
    // 0 and 1 element, odd sizes, sizes not divisible by the world, and sizes that cross the
    // TCP ring threshold (64 KiB), the shm naive threshold (128 KiB) and several 64 KiB slots.
    let big = [0usize, 1, 2, 3, 7, 1001, 20_011, 40_003];
    let small = [0usize, 1, 5, 333];
    let checks = run_world(n, backend, 64 * 1024, Duration::from_secs(240), move |pg| {
        let mut c = check_dtype::<f32>(&pg, &big);
        c += check_dtype::<i64>(&pg, &big);
        c += check_dtype::<f64>(&pg, &small);
        c += check_dtype::<i32>(&pg, &small);
        c += check_dtype::<f16>(&pg, &[0, 3, 2049, 40_001]);
        c += check_dtype::<bf16>(&pg, &small);
        (c, pg.backend_name())
    });
    for (c, name) in checks {
        assert!(c > 0);
        let want = match backend {
            BackendChoice::Shm => "shm",
            _ => "tcp",
        };
        assert_eq!(name, want);
    }
}

/// Fake hosts exercise the hierarchical backend: 2 hosts x 2 ranks (blocked layout), an
/// interleaved layout and uneven hosts (all-gather falls back to per-rank broadcasts).
#[test]
fn hier_fake_hosts() {
    let layouts: [(usize, HostOf); 3] = [
        (4, |r| Some(format!("h{}", r / 2))),
        (4, |r| Some(format!("h{}", r % 2))),
        (3, |r| Some(format!("h{}", r / 2))),
    ];
    for (n, host) in layouts {
        let outs = run_world_hosts(
            n,
            BackendChoice::Auto,
            64 * 1024,
            Duration::from_secs(240),
            host,
            |pg| {
                let sizes = [0usize, 1, 7, 1001, 40_003];
                let mut c = check_dtype::<f32>(&pg, &sizes);
                c += check_dtype::<i64>(&pg, &[0, 3, 333]);
                c += check_dtype::<bf16>(&pg, &[5, 2049]);
                (c, pg.backend_name())
            },
        );
        for (c, name) in outs {
            assert!(c > 0);
            assert_eq!(name, "shm+tcp");
        }
    }
}

#[test]
fn tcp_world_1() {
    matrix(BackendChoice::Tcp, 1);
}
#[test]
fn tcp_world_2() {
    matrix(BackendChoice::Tcp, 2);
}
#[test]
fn tcp_world_3() {
    matrix(BackendChoice::Tcp, 3);
}
#[test]
fn tcp_world_4() {
    matrix(BackendChoice::Tcp, 4);
}
#[test]
fn shm_world_1() {
    matrix(BackendChoice::Shm, 1);
}
#[test]
fn shm_world_2() {
    matrix(BackendChoice::Shm, 2);
}
#[test]
fn shm_world_3() {
    matrix(BackendChoice::Shm, 3);
}
#[test]
fn shm_world_4() {
    matrix(BackendChoice::Shm, 4);
}

/// Random (non-integer) floats: every rank must hold the same bits, and shm must equal the
/// left-to-right sequential sum exactly.
#[test]
fn bit_identical_random_floats() {
    for backend in [BackendChoice::Tcp, BackendChoice::Shm] {
        for n in [2usize, 3, 4] {
            for len in [17usize, 5000, 70_001] {
                let gen = move |r: usize| -> Vec<f32> {
                    let mut x = 0x9e37_79b9u32.wrapping_mul(r as u32 + 1);
                    (0..len)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 17;
                            x ^= x << 5;
                            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
                        })
                        .collect()
                };
                let outs = run_world(n, backend, 64 * 1024, Duration::from_secs(120), move |pg| {
                    let mut b = gen(pg.rank());
                    pg.all_reduce(&mut b, ReduceOp::Avg).expect("all_reduce");
                    b
                });
                for o in &outs[1..] {
                    assert!(
                        o.iter()
                            .zip(&outs[0])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{backend:?} n {n} len {len}: ranks differ"
                    );
                }
                if backend == BackendChoice::Shm {
                    let mut acc = gen(0);
                    for r in 1..n {
                        f32::reduce(&mut acc, &gen(r), ReduceOp::Sum);
                    }
                    f32::div(&mut acc, n);
                    assert_eq!(outs[0], acc);
                }
            }
        }
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    run_world(2, BackendChoice::Tcp, 4096, Duration::from_secs(60), |pg| {
        let mut b = [1.0f32; 4];
        let e = pg.broadcast(&mut b, 5).unwrap_err();
        assert!(e.to_string().contains("root 5"), "{e}");
        let mut small = [0f32; 3];
        let e = pg.all_gather(&b, &mut small).unwrap_err();
        assert_eq!(e.op(), "all_gather");
        let e = pg
            .reduce_scatter(&b, &mut small, ReduceOp::Sum)
            .unwrap_err();
        assert!(e
            .to_string()
            .starts_with(&format!("rank {}: reduce_scatter", pg.rank())));
        pg.barrier()
            .expect("group still usable after argument errors");
    });
}

/// A peer that disappears mid-collective gives a typed error naming the peer, well within the
/// timeout (TCP sees EOF at once).
#[test]
fn tcp_dead_peer_is_an_error() {
    let outs = run_world(3, BackendChoice::Tcp, 4096, Duration::from_secs(60), |pg| {
        if pg.rank() == 2 {
            drop(pg); // closes its sockets, like a crashed process
            return None;
        }
        let t = Instant::now();
        let mut b = vec![1.0f32; 100_000];
        let e = pg.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
        let again = pg.barrier().unwrap_err();
        Some((
            e.is_peer_failure(),
            t.elapsed(),
            matches!(again, RuntimeError::Poisoned { .. }),
            e.to_string(),
        ))
    });
    for (peer_failure, took, poisoned, msg) in outs.into_iter().flatten() {
        assert!(peer_failure, "{msg}");
        assert!(poisoned);
        assert!(took < Duration::from_secs(20), "took {took:?}: {msg}");
        assert!(
            msg.contains("peer rank") || msg.contains("timed out"),
            "{msg}"
        );
    }
}

/// On shm a missing peer (here: a thread that never enters the collective) is reported as a
/// timeout after the configured bound.
#[test]
fn shm_stuck_peer_times_out() {
    let store = MemStore::new();
    let run = format!("stuck{}", std::process::id());
    let mut handles = Vec::new();
    for r in 0..2 {
        let (store, run) = (store.clone(), run.clone());
        handles.push(std::thread::spawn(move || {
            let mut o = GroupOptions::new(r, 2, &run);
            o.backend = BackendChoice::Shm;
            o.timeout = Duration::from_millis(600);
            let pg = ProcessGroup::new(&store, &o).expect("init");
            if r == 1 {
                std::thread::sleep(Duration::from_secs(3));
                return None;
            }
            let t = Instant::now();
            let mut b = [1i32; 8];
            let e = pg.all_reduce(&mut b, ReduceOp::Sum).unwrap_err();
            Some((t.elapsed(), e))
        }));
    }
    let (took, e) = handles.remove(0).join().unwrap().unwrap();
    assert!(
        matches!(
            e,
            RuntimeError::Timeout {
                rank: 0,
                op: "all_reduce",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(10),
        "{took:?}"
    );
    handles.remove(0).join().unwrap();
}

#[test]
fn init_times_out_without_peers() {
    let store = MemStore::new();
    let mut o = GroupOptions::new(0, 2, "lonely");
    o.timeout = Duration::from_millis(300);
    let t = Instant::now();
    let e = ProcessGroup::new(&store, &o).err().expect("must fail");
    assert!(matches!(e, RuntimeError::Timeout { op: "init", .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(ProcessGroup::new(&store, &GroupOptions::new(3, 2, "x")).is_err());
}

#[test]
fn auto_picks_tcp_across_fake_hosts() {
    let store = MemStore::new();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut o = GroupOptions::new(r, 2, "fakehosts");
                o.host_id = Some(format!("host{r}"));
                let pg = ProcessGroup::new(&store, &o).expect("init");
                let mut b = [r as f64 + 1.0];
                pg.all_reduce(&mut b, ReduceOp::Sum).expect("all_reduce");
                (pg.backend_name(), b[0])
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), ("tcp", 3.0));
    }
}

#[test]
fn hier_bit_identical_random_floats() {
    for len in [17usize, 70_001] {
        let outs = run_world_hosts(
            4,
            BackendChoice::Auto,
            64 * 1024,
            Duration::from_secs(120),
            |r| Some(format!("h{}", r / 2)),
            move |pg| {
                let mut x = 0x2545_f491u32.wrapping_mul(pg.rank() as u32 + 3);
                let mut b: Vec<f32> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as f32 / u32::MAX as f32 - 0.5
                    })
                    .collect();
                pg.all_reduce(&mut b, ReduceOp::Avg).expect("all_reduce");
                b.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            },
        );
        assert!(
            outs.iter().all(|o| *o == outs[0]),
            "len {len}: ranks differ"
        );
    }
}

/// Two concurrent jobs with the same run id (torchrun's default is "none") on one machine get
/// separate segments.
#[test]
fn same_run_id_concurrent_groups_do_not_collide() {
    let hs: Vec<_> = (0..2)
        .map(|job| {
            std::thread::spawn(move || {
                let store = MemStore::new();
                let ranks: Vec<_> = (0..2)
                    .map(|r| {
                        let store = store.clone();
                        std::thread::spawn(move || {
                            let mut o = GroupOptions::new(r, 2, "none");
                            o.backend = BackendChoice::Shm;
                            o.timeout = Duration::from_secs(30);
                            let pg = ProcessGroup::new(&store, &o).expect("init");
                            let mut b = vec![(job * 10 + r) as i64; 1000];
                            for _ in 0..50 {
                                pg.all_reduce(&mut b, ReduceOp::Max).expect("all_reduce");
                            }
                            b[999]
                        })
                    })
                    .collect();
                ranks
                    .into_iter()
                    .map(|h| h.join().expect("rank"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let got: Vec<Vec<i64>> = hs.into_iter().map(|h| h.join().expect("job")).collect();
    assert_eq!(got, vec![vec![1, 1], vec![11, 11]]);
}
