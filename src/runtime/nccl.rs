//! NCCL backend through cudarc 0.19 with dynamic loading (cargo feature `nccl`).
//!
//! Traps handled here (spec runtime.md §1, each verified there):
//! - a missing libcuda/libnccl or symbol makes cudarc *panic*: [`preflight`] calls the
//!   `is_culib_present()` checks first, and the communicator thread runs under `catch_unwind`;
//! - `Comm` is `!Send`: one thread owns it and runs every job; callers get results by channel;
//! - `Comm::from_rank` does not bind a device: the thread calls `bind_to_thread()` on the chosen
//!   device first (LOCAL_RANK, 0 under a single-entry CUDA_VISIBLE_DEVICES, or
//!   `RDRUN_CUDA_DEVICE`), otherwise every local rank lands on device 0 ("Duplicate GPU");
//! - `NcclStatus::NumResults` (a result code newer than the bindings) is treated as an error;
//! - `NcclError`'s Debug says only "NcclError": errors carry the code, `ncclGetErrorString` and
//!   `ncclGetLastError` text.
//!
//! The 128-byte unique id goes through the store like PyTorch's `broadcastUniqueNCCLID`: rank 0
//! sets `nccl/id/<seq>` under the group prefix, the others wait for it.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::{Comm, Id, NcclType};

use bytemuck::Pod;

use super::backend::Backend;
use super::bootstrap::{store_from_env, GroupOptions};
use super::elem::{DType, Element, ReduceOp};
use super::error::{Result, RuntimeError};
use super::groupstore::{GroupStore, StoreFailure};

/// Which CUDA device a local rank uses: `RDRUN_CUDA_DEVICE` wins; a single visible device is 0;
/// otherwise the local rank, which must exist.
pub fn device_ordinal(
    local_rank: usize,
    visible_devices: Option<&str>,
    override_ordinal: Option<usize>,
    device_count: usize,
) -> std::result::Result<usize, String> {
    let ord = if let Some(o) = override_ordinal {
        o
    } else if visible_devices
        .is_some_and(|v| v.split(',').filter(|s| !s.trim().is_empty()).count() == 1)
    {
        0
    } else {
        local_rank
    };
    if ord >= device_count {
        return Err(format!(
            "device {ord} does not exist ({device_count} visible; LOCAL_RANK {local_rank}, CUDA_VISIBLE_DEVICES {:?})",
            visible_devices.unwrap_or("")
        ));
    }
    Ok(ord)
}

/// Id bytes as portable u8 (c_char is i8 on x86_64 and u8 on aarch64).
pub fn id_to_bytes(internal: &[std::ffi::c_char; 128]) -> [u8; 128] {
    let mut b = [0u8; 128];
    for (d, s) in b.iter_mut().zip(internal) {
        *d = *s as u8;
    }
    b
}

/// Inverse of [`id_to_bytes`]; the length must be exactly 128 (NCCL_UNIQUE_ID_BYTES).
pub fn id_from_bytes(b: &[u8]) -> std::result::Result<[std::ffi::c_char; 128], String> {
    if b.len() != 128 {
        return Err(format!(
            "nccl unique id has {} bytes, expected 128",
            b.len()
        ));
    }
    let mut out = [0 as std::ffi::c_char; 128];
    for (d, s) in out.iter_mut().zip(b) {
        *d = *s as std::ffi::c_char;
    }
    Ok(out)
}

/// NCCL's own description of an error: code name text plus the last error message.
fn nccl_text(e: &NcclError) -> String {
    // SAFETY: both functions return pointers to static or thread-local NUL-terminated strings
    // (or null); the library is loaded because an NCCL call produced `e`.
    unsafe {
        let read = |p: *const std::ffi::c_char| {
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let s = read(cudarc::nccl::sys::ncclGetErrorString(e.0));
        let last = read(cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut()));
        if last.is_empty() {
            s
        } else {
            format!("{s}. Last error: {last}")
        }
    }
}

fn nccl_err(rank: usize, op: &'static str, e: &NcclError) -> RuntimeError {
    RuntimeError::Nccl {
        rank,
        op,
        code: e.0 as i64,
        msg: nccl_text(e),
    }
}

/// Maps cudarc's status to ours; `NumResults` means an unknown code, hence an error.
fn check(
    rank: usize,
    op: &'static str,
    r: std::result::Result<NcclStatus, NcclError>,
) -> Result<()> {
    match r {
        Ok(NcclStatus::Success) => Ok(()),
        Ok(NcclStatus::InProgress) => Err(RuntimeError::Nccl {
            rank,
            op,
            code: 7,
            msg: "operation still in progress on a blocking communicator".into(),
        }),
        Ok(NcclStatus::NumResults) => Err(RuntimeError::Nccl {
            rank,
            op,
            code: -1,
            msg: "NCCL returned a result code unknown to these bindings (library newer than cudarc's nccl feature?)".into(),
        }),
        Err(e) => Err(nccl_err(rank, op, &e)),
    }
}

/// Checks, without panicking, that the CUDA driver, a device and libnccl can be loaded.
/// Returns the device count and NCCL version.
pub fn preflight(rank: usize) -> Result<(usize, i32)> {
    let unavailable = |why: String| RuntimeError::Unavailable {
        rank,
        op: "init",
        backend: "nccl".into(),
        why,
    };
    // SAFETY: these only dlopen and close the library; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(unavailable(
            "the CUDA driver library (libcuda.so) cannot be loaded".into(),
        ));
    }
    // SAFETY: as above, a dlopen/dlclose probe of libnccl.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(unavailable(
            "libnccl.so cannot be loaded: cudarc looks only for unversioned names; for a pip NCCL put a directory with libnccl.so -> .../nvidia/nccl/lib/libnccl.so.2 on LD_LIBRARY_PATH (rdrun does this)".into(),
        ));
    }
    let count = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| unavailable("the CUDA driver panicked while counting devices".into()))?
        .map_err(|e| unavailable(format!("no usable CUDA device: {e:?}")))?;
    if count <= 0 {
        return Err(unavailable("no CUDA device is visible".into()));
    }
    let version = std::panic::catch_unwind(cudarc::nccl::result::get_nccl_version)
        .map_err(|_| unavailable("libnccl is missing ncclGetVersion".into()))?
        .map_err(|e| nccl_err(rank, "init", &e))?;
    Ok((count as usize, version))
}

/// The CUDA device `local_rank` would use (see [`device_ordinal`]; `CUDA_VISIBLE_DEVICES`,
/// `RDRUN_CUDA_DEVICE`) once [`preflight`] passed, or why NCCL cannot be used here.
pub fn probe_device(rank: usize, local_rank: usize) -> std::result::Result<usize, String> {
    let (count, _) = preflight(rank).map_err(|e| match e {
        RuntimeError::Unavailable { why, .. } => why,
        other => other.to_string(),
    })?;
    let vis = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let over = std::env::var("RDRUN_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    device_ordinal(local_rank, vis.as_deref(), over, count)
}

type Job = Box<dyn FnOnce(&Comm) + Send>;

/// An NCCL communicator owned by one thread. Host-slice collectives stage through the device;
/// [`NcclGroup::run`] gives direct access to the `Comm` for `CudaSlice` work.
pub struct NcclGroup {
    rank: usize,
    world: usize,
    ordinal: usize,
    timeout: Duration,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Set when a job timed out: the owning thread may be stuck inside NCCL, so drop must not
    /// join it (the process is expected to exit and let the launcher restart the group).
    stuck: std::sync::atomic::AtomicBool,
}

fn store_err(rank: usize, e: StoreFailure) -> RuntimeError {
    RuntimeError::Store {
        rank,
        op: "init",
        msg: e.to_string(),
    }
}

/// The communicator's unique id: rank 0 makes it and publishes it at `key`, the others wait
/// for it there.
fn share_id(store: &dyn GroupStore, key: &str, rank: usize, timeout: Duration) -> Result<Id> {
    if rank == 0 {
        let id = std::panic::catch_unwind(Id::new)
            .map_err(|_| RuntimeError::Unavailable {
                rank,
                op: "init",
                backend: "nccl".into(),
                why: "ncclGetUniqueId panicked (missing symbol?)".into(),
            })?
            .map_err(|e| nccl_err(rank, "init", &e))?;
        store
            .set(key, &id_to_bytes(id.internal()))
            .map_err(|e| store_err(rank, e))?;
        Ok(id)
    } else {
        let b = store
            .get_wait(key, timeout)
            .map_err(|e| store_err(rank, e))?;
        Ok(Id::uninit(id_from_bytes(&b).map_err(|msg| {
            RuntimeError::Store {
                rank,
                op: "init",
                msg,
            }
        })?))
    }
}

/// The thread that owns the communicator: binds device `ordinal`, creates the communicator
/// (its outcome sent on `init_tx`), then runs the jobs until their sender is gone.
fn owner_thread(
    (rank, world, ordinal): (usize, usize, usize),
    id: Id,
    job_rx: std::sync::mpsc::Receiver<Job>,
    init_tx: std::sync::mpsc::SyncSender<Result<()>>,
) {
    let body = AssertUnwindSafe(|| -> Result<Comm> {
        let drv = |e: cudarc::driver::DriverError| RuntimeError::Unavailable {
            rank,
            op: "init",
            backend: "nccl".into(),
            why: format!("CUDA device {ordinal}: {e:?}"),
        };
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        ctx.bind_to_thread().map_err(drv)?;
        let stream: Arc<CudaStream> = ctx.new_stream().map_err(drv)?;
        Comm::from_rank(stream, rank, world, id).map_err(|e| nccl_err(rank, "init", &e))
    });
    let comm = match std::panic::catch_unwind(body) {
        Ok(Ok(c)) => {
            let _ = init_tx.send(Ok(()));
            c
        }
        Ok(Err(e)) => {
            let _ = init_tx.send(Err(e));
            return;
        }
        Err(_) => {
            let _ = init_tx.send(Err(RuntimeError::Unavailable {
                rank,
                op: "init",
                backend: "nccl".into(),
                why: "cudarc panicked during communicator setup".into(),
            }));
            return;
        }
    };
    while let Ok(job) = job_rx.recv() {
        if std::panic::catch_unwind(AssertUnwindSafe(|| job(&comm))).is_err() {
            tracing::error!(rank, "an NCCL job panicked");
        }
    }
}

impl NcclGroup {
    /// Creates the communicator: preflight, unique id through `store` under `prefix`, then the
    /// owning thread binds `ordinal` and calls `Comm::from_rank` on a fresh stream.
    pub fn new(
        store: &dyn GroupStore,
        prefix: &str,
        rank: usize,
        world: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> Result<Self> {
        preflight(rank)?;
        let id = share_id(store, &format!("{prefix}nccl/id/0"), rank, timeout)?;
        let (jobs, job_rx) = channel::<Job>();
        let (init_tx, init_rx) = sync_channel::<Result<()>>(1);
        let thread = std::thread::Builder::new()
            .name(format!("rdrun-nccl-{rank}"))
            .spawn(move || owner_thread((rank, world, ordinal), id, job_rx, init_tx))
            .map_err(|e| RuntimeError::Io {
                rank,
                op: "init",
                msg: format!("spawn the NCCL thread: {e}"),
            })?;
        match init_rx.recv_timeout(timeout) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(RuntimeError::Timeout {
                    rank,
                    op: "init",
                    after: timeout,
                    waiting_for: "ncclCommInitRank (are all ranks up?)".into(),
                })
            }
        }
        Ok(NcclGroup {
            rank,
            world,
            ordinal,
            timeout,
            jobs: Some(jobs),
            thread: Some(thread),
            stuck: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// From the launcher's environment (`RDRUN_FILE_STORE` or the TCP store).
    pub fn init_from_env() -> Result<Self> {
        let (env, opts) = GroupOptions::from_process_env()?;
        let ordinal =
            probe_device(env.rank, env.local_rank).map_err(|why| RuntimeError::Unavailable {
                rank: env.rank,
                op: "init",
                backend: "nccl".into(),
                why,
            })?;
        let prefix = format!("rdrun/{}/{}/nccl/", env.run_id, env.restart_count);
        let store = store_from_env(&env, opts.timeout)?;
        Self::new(
            store.as_ref(),
            &prefix,
            env.rank,
            env.world_size,
            ordinal,
            opts.timeout,
        )
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world_size(&self) -> usize {
        self.world
    }
    pub fn device_ordinal(&self) -> usize {
        self.ordinal
    }

    /// Runs `f` on the thread that owns the communicator (for `CudaSlice` collectives; use
    /// `comm.stream()` for allocations) and waits for its result, bounded by the timeout.
    pub fn run<R, F>(&self, op: &'static str, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&Comm) -> R + Send + 'static,
    {
        let (tx, rx) = sync_channel(1);
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        self.jobs
            .as_ref()
            .expect("invariant: sender lives until drop")
            .send(job)
            .map_err(|_| RuntimeError::Poisoned {
                rank: self.rank,
                op,
                first: "the NCCL thread has exited".into(),
            })?;
        rx.recv_timeout(self.timeout)
            .map_err(|_| RuntimeError::Timeout {
                rank: self.rank,
                op,
                after: self.timeout,
                waiting_for: "the NCCL collective to complete".into(),
            })
    }

    /// All-reduce of a host slice through device memory (H2D, ncclAllReduce, D2H).
    pub fn all_reduce<T>(&self, buf: &mut [T], op: ReduceOp) -> Result<()>
    where
        T: Element + NcclType + DeviceRepr + ValidAsZeroBits,
    {
        self.staged_all_reduce(buf, op)
    }

    fn staged_all_reduce<T>(&self, buf: &mut [T], op: ReduceOp) -> Result<()>
    where
        T: Pod + NcclType + DeviceRepr + ValidAsZeroBits + Send,
    {
        // Every rank passes the same length, so every rank skips an empty call alike (a
        // zero-byte device allocation is an error in CUDA).
        if buf.is_empty() {
            return Ok(());
        }
        let rank = self.rank;
        let host = buf.to_vec();
        let out = self.run("all_reduce", move |c| -> Result<Vec<T>> {
            let s = c.stream();
            let drv = cuda_err(rank, "all_reduce");
            let mut d = s.clone_htod(&host).map_err(drv)?;
            check(
                rank,
                "all_reduce",
                c.all_reduce_in_place(&mut d, &nccl_op(op)),
            )?;
            s.clone_dtoh(&d).map_err(drv)
        })??;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn staged_reduce_scatter<T>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()>
    where
        T: Pod + NcclType + DeviceRepr + ValidAsZeroBits + Send,
    {
        if recv.is_empty() {
            return Ok(());
        }
        let rank = self.rank;
        let (host, n) = (send.to_vec(), recv.len());
        let out = self.run("reduce_scatter", move |c| -> Result<Vec<T>> {
            let s = c.stream();
            let drv = cuda_err(rank, "reduce_scatter");
            let d_send = s.clone_htod(&host).map_err(drv)?;
            let mut d_recv = s.alloc_zeros::<T>(n).map_err(drv)?;
            check(
                rank,
                "reduce_scatter",
                c.reduce_scatter(&d_send, &mut d_recv, &nccl_op(op)),
            )?;
            s.clone_dtoh(&d_recv).map_err(drv)
        })??;
        recv.copy_from_slice(&out);
        Ok(())
    }

    /// Seconds per in-place f32 all-reduce of `count` elements on the device (bench).
    pub fn bench_all_reduce_f32(&self, count: usize, iters: usize) -> Result<f64> {
        let rank = self.rank;
        self.run("all_reduce", move |c| -> Result<f64> {
            let s = c.stream();
            let drv = |e: cudarc::driver::DriverError| RuntimeError::Io {
                rank,
                op: "all_reduce",
                msg: format!("cuda: {e:?}"),
            };
            let mut d = s.alloc_zeros::<f32>(count.max(1)).map_err(drv)?;
            for _ in 0..2 {
                check(
                    rank,
                    "all_reduce",
                    c.all_reduce_in_place(&mut d, &cudarc::nccl::ReduceOp::Sum),
                )?;
            }
            s.synchronize().map_err(drv)?;
            let t0 = Instant::now();
            for _ in 0..iters {
                check(
                    rank,
                    "all_reduce",
                    c.all_reduce_in_place(&mut d, &cudarc::nccl::ReduceOp::Sum),
                )?;
            }
            s.synchronize().map_err(drv)?;
            Ok(t0.elapsed().as_secs_f64() / iters.max(1) as f64)
        })?
    }
}

fn cuda_err(
    rank: usize,
    op: &'static str,
) -> impl Fn(cudarc::driver::DriverError) -> RuntimeError + Copy {
    move |e| RuntimeError::Io {
        rank,
        op,
        msg: format!("cuda: {e:?}"),
    }
}

fn nccl_op(op: ReduceOp) -> cudarc::nccl::ReduceOp {
    match op {
        ReduceOp::Sum => cudarc::nccl::ReduceOp::Sum,
        ReduceOp::Avg => cudarc::nccl::ReduceOp::Avg,
        ReduceOp::Max => cudarc::nccl::ReduceOp::Max,
        ReduceOp::Min => cudarc::nccl::ReduceOp::Min,
    }
}

/// Host-slice collectives of a [`super::ProcessGroup`] forced to NCCL (`RDRUN_BACKEND=nccl`,
/// `train --backend nccl`): each call stages the bytes through device memory on the
/// communicator's thread. Buffers are copied into typed vectors first (a `&[u8]` need not be
/// aligned for f64). The [`NcclGroup`] is shared with the process group, which hands it out for
/// device-buffer work ([`super::ProcessGroup::nccl`]).
pub struct NcclBackend {
    group: Arc<NcclGroup>,
}

impl NcclBackend {
    pub fn new(group: Arc<NcclGroup>) -> Self {
        NcclBackend { group }
    }
}

/// `f::<T>(args)` for the element type of `dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            DType::BF16 => $f::<half::bf16>($($arg),*),
            DType::I32 => $f::<i32>($($arg),*),
            DType::I64 => $f::<i64>($($arg),*),
        }
    };
}

/// The bytes as a freshly allocated (so aligned) vector of `T`; callers pass whole elements.
fn typed_copy<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn all_reduce_bytes<T>(g: &NcclGroup, buf: &mut [u8], op: ReduceOp) -> Result<()>
where
    T: Pod + NcclType + DeviceRepr + ValidAsZeroBits + Send,
{
    let mut typed: Vec<T> = typed_copy(buf);
    g.staged_all_reduce(&mut typed, op)?;
    buf.copy_from_slice(bytemuck::cast_slice(&typed));
    Ok(())
}

fn reduce_scatter_bytes<T>(g: &NcclGroup, send: &[u8], recv: &mut [u8], op: ReduceOp) -> Result<()>
where
    T: Pod + NcclType + DeviceRepr + ValidAsZeroBits + Send,
{
    let typed_send: Vec<T> = typed_copy(send);
    let mut typed_recv: Vec<T> = typed_copy(recv);
    g.staged_reduce_scatter(&typed_send, &mut typed_recv, op)?;
    recv.copy_from_slice(bytemuck::cast_slice(&typed_recv));
    Ok(())
}

impl Backend for NcclBackend {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let g = &*self.group;
        by_dtype!(dtype, all_reduce_bytes(g, buf, op))
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let rank = self.group.rank;
        let host = buf.to_vec();
        let out = self.group.run("broadcast", move |c| -> Result<Vec<u8>> {
            let s = c.stream();
            let drv = cuda_err(rank, "broadcast");
            let mut d = s.clone_htod(&host).map_err(drv)?;
            check(rank, "broadcast", c.broadcast_in_place(&mut d, root as i32))?;
            s.clone_dtoh(&d).map_err(drv)
        })??;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        if send.is_empty() {
            return Ok(());
        }
        let rank = self.group.rank;
        let (host, n) = (send.to_vec(), recv.len());
        let out = self.group.run("all_gather", move |c| -> Result<Vec<u8>> {
            let s = c.stream();
            let drv = cuda_err(rank, "all_gather");
            let d_send = s.clone_htod(&host).map_err(drv)?;
            let mut d_recv = s.alloc_zeros::<u8>(n).map_err(drv)?;
            check(rank, "all_gather", c.all_gather(&d_send, &mut d_recv))?;
            s.clone_dtoh(&d_recv).map_err(drv)
        })??;
        recv.copy_from_slice(&out);
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let g = &*self.group;
        by_dtype!(dtype, reduce_scatter_bytes(g, send, recv, op))
    }

    fn barrier(&mut self) -> Result<()> {
        // An all-reduce of one element: returns (after its device-to-host copy) only once
        // every rank has contributed.
        let mut one = [0f32];
        self.group.staged_all_reduce(&mut one, ReduceOp::Sum)
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        self.jobs.take();
        if self.stuck.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Case = (
        usize,
        Option<&'static str>,
        Option<usize>,
        usize,
        std::result::Result<usize, ()>,
    );

    #[test]
    fn ordinal_table() {
        let cases: &[Case] = &[
            (1, None, None, 4, Ok(1)),
            (1, Some("3"), None, 1, Ok(0)),
            (1, Some("2,3"), None, 2, Ok(1)),
            (1, None, Some(0), 1, Ok(0)),
            (2, None, None, 1, Err(())),
            (0, Some(""), None, 1, Ok(0)),
        ];
        for (lr, vis, over, count, want) in cases {
            let got = device_ordinal(*lr, *vis, *over, *count).map_err(|_| ());
            assert_eq!(got, *want, "{lr} {vis:?} {over:?} {count}");
        }
    }

    #[test]
    fn id_bytes_round_trip() {
        let mut raw = [0 as std::ffi::c_char; 128];
        for (i, c) in raw.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37) as std::ffi::c_char;
        }
        let b = id_to_bytes(&raw);
        assert_eq!(id_from_bytes(&b).unwrap(), raw);
        assert!(id_from_bytes(&b[..127]).unwrap_err().contains("127 bytes"));
    }

    /// Without a GPU (or without libnccl on the library path) setup is an error, never a panic.
    #[test]
    fn missing_libraries_are_errors() {
        // SAFETY: only probes whether the libraries can be opened.
        let have = unsafe {
            cudarc::driver::sys::is_culib_present() && cudarc::nccl::sys::is_culib_present()
        };
        if have {
            return; // a GPU machine: scripts/gpu-check.sh covers this path
        }
        let e = preflight(3).unwrap_err();
        assert!(
            matches!(e, RuntimeError::Unavailable { rank: 3, .. }),
            "{e}"
        );
        let store = super::super::groupstore::MemStore::new();
        let e = NcclGroup::new(&store, "p/", 0, 1, 0, Duration::from_secs(1))
            .err()
            .expect("no nccl here");
        assert!(e.to_string().contains("nccl"), "{e}");
    }
}
