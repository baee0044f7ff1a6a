//! Shared-memory backend for ranks on one host.
//!
//! One file `/dev/shm/rdrun-<run>.<hash>.<round>.<tag>` per communicator, created by rank 0
//! (`O_EXCL`, after removing a stale file of the same name), mapped by every rank, and unlinked by
//! rank 0 as soon as every rank has mapped it — so a crash after setup leaves nothing behind; only a
//! crash *during* setup can leave a file, which the launcher removes with [`cleanup_run_shm`].
//!
//! Layout: a header (per-rank cache line: arrival counter, pid, futex sequence, pipeline
//! progress counters) then five sets of one slot per rank: two for the barrier-based collectives,
//! three for the pipelined all-reduce. Algorithms follow DeepSpeed's CPU SHM all-reduce
//! (`csrc/cpu/comm/shm.cpp`): small messages — copy in, barrier, every rank reduces all slots in
//! rank order; large messages — sliced (each rank folds its 1/n slice of a piece in rank order and
//! the others copy the result out), but pipelined over slot-sized pieces with per-piece progress
//! counters instead of two barriers per piece (see `ShmComm::all_reduce_pipelined`). Both
//! orders are fixed, so every rank ends bit-identical and equal to a sequential left-to-right
//! reduction.
//!
//! Alternating the two barrier sets means an operation never overwrites a set that a slower rank
//! may still read: reusing set A at op k+2 requires passing op k+1's barrier, which every rank
//! enters only after finishing op k. The pipeline's sets are guarded by its own counters.
//!
//! Waiting spins briefly, then `sched_yield`s, then sleeps in `FUTEX_WAIT` (2 oversubscribed
//! cores make pure spinning collapse, spec runtime.md §3.3), checking the deadline and whether
//! every peer pid is still alive (`kill(pid, 0)`), so a dead peer is reported within milliseconds.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::backend::{all_gather_own, alone, reduce_scatter_alone, Backend};
use super::elem::{div_bytes, fold_dual_bytes, reduce_bytes, reduce_into_bytes, DType, ReduceOp};
use super::error::{Result, RuntimeError};
use super::tcp::chunk_bounds;

/// Messages up to this size use the "every rank reduces everything" path.
pub const NAIVE_THRESHOLD: usize = 128 * 1024;
/// Default bytes per rank slot (`RDRUN_SHM_SLOT_BYTES` overrides). Small enough that a piece
/// (copy in, reduce, copy out) stays in cache: measured on the 2-vCPU VM (512 KiB L2 per core),
/// 256-512 KiB slots gave 1.5-2x the bandwidth of 4 MiB slots at 64 MiB; with the pipeline,
/// which keeps two pieces in flight, 256 KiB beat 512 KiB by ~15%.
pub const DEFAULT_SLOT: usize = 256 * 1024;
const MAGIC: u64 = 0x7264_7275_6e53_484d; // "rdrunSHM"
/// Slot sets of the barrier-based collectives (alternating, see the module docs).
const BARRIER_SETS: usize = 2;
/// Slot sets the pipelined all-reduce cycles through (3: a rank may run one piece ahead).
const PIPE_SETS: usize = 3;
/// Words of a rank's header line: barrier arrivals, pid, (word 2: the futex sequence, 32 bits),
/// and the pipelined all-reduce's per-piece progress counters (pieces copied in, folded, done).
const W_ARRIVE: usize = 0;
const W_PID: usize = 1;
const W_IN: usize = 3;
const W_RES: usize = 4;
const W_DONE: usize = 5;
pub use crate::workerenv::{
    cleanup_run_shm, cleanup_run_shm_in, fnv1a, run_shm_prefix, sanitize_run_id, SHM_DIR,
};

/// The segment path for one communicator (`tag` distinguishes communicators of one round).
pub fn segment_path(run_id: &str, restart: u32, tag: &str) -> PathBuf {
    Path::new(SHM_DIR).join(format!(
        "{}{}.{:016x}",
        run_shm_prefix(run_id),
        restart,
        fnv1a(tag.as_bytes())
    ))
}

/// A segment path for `tag` that no other group shares, even another job on this machine with
/// the same run id (torchrun's default run id is "none"): the tag gets this process's pid and the
/// current time. Rank 0 creates it and announces it through the store.
pub fn unique_segment_path(run_id: &str, restart: u32, tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    segment_path(
        run_id,
        restart,
        &format!("{tag}/{}/{nanos}", std::process::id()),
    )
}

/// Creates a segment file readable and writable by its owner only (0600, whatever the umask):
/// the ranks of a job run as one user, and a segment holds the job's tensors.
fn create_segment(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Whether process `pid` still runs: `kill(pid, 0)` fails with ESRCH once it is reaped, and a
/// zombie (exited, not yet reaped by its parent) shows state `Z`/`X` in `/proc/<pid>/stat`
/// (proc(5): the state follows the parenthesised command name).
fn pid_alive(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
        == Err(nix::errno::Errno::ESRCH)
    {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z') | Some('X')
        ),
        Err(_) => true,
    }
}

/// Sleeps while `*word == expected` (or until `timeout` or a wake-up).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 inside a shared mapping with a valid timespec;
    // the kernel only reads both. Errors (EAGAIN when the value changed, EINTR, ETIMEDOUT) all
    // mean "re-check", which the caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32; no memory is written.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Sizes of the mapping for `world` ranks and `slot` bytes per slot.
fn layout(world: usize, slot: usize) -> (usize, usize) {
    let header = (64 * (world + 1)).div_ceil(4096) * 4096;
    (header, header + (BARRIER_SETS + PIPE_SETS) * world * slot)
}

/// Rank 0's segment: a stale one at `path` removed, then created with `len` bytes.
fn create_sized(path: &Path, len: usize) -> std::result::Result<std::fs::File, String> {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::warn!(path = %path.display(), "removed a stale shm segment"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove stale {}: {e}", path.display())),
    }
    let f = create_segment(path).map_err(|e| format!("create {}: {e}", path.display()))?;
    f.set_len(len as u64)
        .map_err(|e| format!("size {}: {e}", path.display()))?;
    Ok(f)
}

/// The segment rank 0 announced, opened: it must lie beside `path`, be an rdrun segment, and
/// have `len` bytes.
fn open_announced(
    path: &Path,
    announced: &Path,
    len: usize,
) -> std::result::Result<std::fs::File, String> {
    let ok = announced.parent() == path.parent()
        && announced
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("rdrun-"));
    if !ok {
        return Err(format!(
            "rank 0 announced an unexpected segment path {}",
            announced.display()
        ));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(announced)
        .map_err(|e| format!("open {}: {e}", announced.display()))?;
    let have = f
        .metadata()
        .map_err(|e| format!("stat {}: {e}", announced.display()))?
        .len();
    if have != len as u64 {
        return Err(format!(
            "{} has {have} bytes, expected {len} (ranks disagree on RDRUN_SHM_SLOT_BYTES?)",
            announced.display()
        ));
    }
    Ok(f)
}

/// Maps `len` bytes of `file` read/write and shared, pages pre-faulted.
fn map_shared(file: &std::fs::File, len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: mapping a regular tmpfs file of exactly `len` bytes (checked by the caller)
    // read/write and shared; the fd may be closed afterwards, the mapping keeps the pages
    // alive. MAP_POPULATE pre-faults the pages (mmap(2)) so the first collectives do not pay a
    // page fault per 4 KiB.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// How setup steps that need the other ranks are performed (the group passes store calls in).
pub trait ShmSetup {
    /// Rank 0 announces that the file exists, and its path.
    fn announce_created(&self, path: &Path) -> Result<()>;
    /// Non-zero ranks wait for the announcement and get the path.
    fn wait_created(&self) -> Result<PathBuf>;
    /// Every rank: returns once all ranks have mapped the file.
    fn all_mapped(&self) -> Result<()>;
}

/// The shared-memory communicator of one rank.
pub struct ShmComm {
    rank: usize,
    world: usize,
    slot: usize,
    header: usize,
    base: *mut u8,
    len: usize,
    epoch: u64,
    set: usize,
    /// Pieces the pipelined all-reduce has processed (equal on every rank between calls).
    pieces: u64,
    timeout: Duration,
    pids: Vec<i32>,
    path: PathBuf,
}

// SAFETY: the mapping is owned by this value; the raw pointer is only dereferenced through
// `&mut self` methods, so moving the value to another thread is sound.
unsafe impl Send for ShmComm {}

impl ShmComm {
    /// Rank 0 creates the segment at `path` (which should be unique to this group, see
    /// [`unique_segment_path`]) and announces it; the others open the announced path (it must lie
    /// in the same directory and be an rdrun segment). Maps it and waits for every rank.
    pub fn open(
        rank: usize,
        world: usize,
        path: &Path,
        slot: usize,
        timeout: Duration,
        setup: &dyn ShmSetup,
    ) -> Result<Self> {
        let shm_err = |msg: String| RuntimeError::Shm {
            rank,
            op: "init",
            msg,
        };
        let slot = (slot.max(4096) / 64) * 64;
        let (header, len) = layout(world, slot);
        let (file, path) = if rank == 0 {
            (
                create_sized(path, len).map_err(shm_err)?,
                path.to_path_buf(),
            )
        } else {
            let announced = setup.wait_created()?;
            (
                open_announced(path, &announced, len).map_err(shm_err)?,
                announced,
            )
        };
        let p =
            map_shared(&file, len).map_err(|e| shm_err(format!("mmap {}: {e}", path.display())))?;
        let mut me = ShmComm {
            rank,
            world,
            slot,
            header,
            base: p,
            len,
            epoch: 0,
            set: 0,
            pieces: 0,
            timeout,
            pids: vec![0; world],
            path: path.clone(),
        };
        if rank == 0 {
            me.word(0, 2).store(world as u64, Ordering::Relaxed);
            me.word(0, 3).store(slot as u64, Ordering::Relaxed);
            me.word(0, 1).store(MAGIC, Ordering::Release);
            setup.announce_created(&path)?;
        } else if me.word(0, 1).load(Ordering::Acquire) != MAGIC {
            return Err(shm_err(format!("{} is not initialized", path.display())));
        }
        me.word(rank + 1, W_PID)
            .store(std::process::id() as u64, Ordering::Release);
        setup.all_mapped()?;
        for r in 0..world {
            me.pids[r] = me.word(r + 1, W_PID).load(Ordering::Acquire) as i32;
        }
        if rank == 0 {
            // Everyone has it mapped: the name is no longer needed, and unlinking now means a
            // crash later cannot leak the segment.
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "unlink shm segment: {e}");
            }
        }
        Ok(me)
    }

    /// The atomic u64 at word `w` of header line `line` (line 0: global, line r+1: rank r).
    fn word(&self, line: usize, w: usize) -> &AtomicU64 {
        debug_assert!(w < 8 && 64 * line + 8 * w + 8 <= self.header);
        // SAFETY: the header lies inside the mapping, 64*line + 8*w is 8-byte aligned (the mapping
        // is page aligned) and header words are only ever accessed atomically.
        unsafe { &*(self.base.add(64 * line + 8 * w) as *const AtomicU64) }
    }

    fn slot_ptr(&self, set: usize, rank: usize) -> *mut u8 {
        // SAFETY: set < BARRIER_SETS + PIPE_SETS and rank < world, so the offset is inside the mapping (see `layout`).
        unsafe {
            self.base
                .add(self.header + (set * self.world + rank) * self.slot)
        }
    }

    /// A view of `len` bytes at `off` of a slot. Callers follow the protocol in the module docs,
    /// which guarantees no other rank writes the same bytes while the view is alive.
    #[allow(clippy::mut_from_ref)]
    fn slot(&self, set: usize, rank: usize, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.slot, "invariant: access inside one slot");
        // SAFETY: in bounds (asserted); exclusive by the barrier protocol described above.
        unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(set, rank).add(off), len) }
    }

    fn next_set(&mut self) -> usize {
        self.set ^= 1;
        self.set
    }

    /// Rank `r`'s 32-bit futex word (a sequence bumped on every publication).
    fn fword(&self, r: usize) -> &AtomicU32 {
        // SAFETY: offset 16 of rank r's header line is inside the header, 4-byte aligned, and
        // only accessed atomically.
        unsafe { &*(self.base.add(64 * (r + 1) + 16) as *const AtomicU32) }
    }

    /// Sets rank-line word `w` of this rank to `v` and wakes sleepers. Both sides use SeqCst
    /// so that either a waiter sees the new value or this rank sees the waiter's sleeper count
    /// (Dekker-style). The futex word is a per-rank sequence, bumped before the wake, so a
    /// sleeper that read it before the bump either fails `FUTEX_WAIT`'s value check or is queued
    /// before the wake (futex(2)); with no sleeper the bump is skipped (one atomic RMW less).
    fn publish(&self, w: usize, v: u64) {
        self.word(self.rank + 1, w).store(v, Ordering::SeqCst);
        if self.word(0, 4).load(Ordering::SeqCst) > 0 {
            self.fword(self.rank).fetch_add(1, Ordering::SeqCst);
            futex_wake(self.fword(self.rank));
        }
    }

    /// All ranks arrive; bounded by the timeout and by peer liveness.
    fn barrier_wait(&mut self, op: &'static str) -> Result<()> {
        self.epoch += 1;
        let e = self.epoch;
        self.publish(W_ARRIVE, e);
        self.wait_all(W_ARRIVE, e, op)
    }

    /// Waits until word `w` of every rank's line is at least `target`; bounded by the timeout
    /// and by peer liveness.
    ///
    /// Waiting: spin ~5 µs (a peer on another idle core arrives within a spin round trip,
    /// 2.4 µs measured, spec §3.3), then `sched_yield` up to ~50 µs, then sleep in
    /// `FUTEX_WAIT` on the missing rank's sequence word (shared futex: the mapping is
    /// MAP_SHARED), waking every 10 ms to check the deadline and peer pids. Publishers
    /// `FUTEX_WAKE` only when the header's sleeper count is non-zero (see [`Self::publish`]).
    fn wait_all(&self, w: usize, target: u64, op: &'static str) -> Result<()> {
        let mut r = 0;
        while r < self.world && self.word(r + 1, w).load(Ordering::Acquire) >= target {
            r += 1;
        }
        if r == self.world {
            return Ok(());
        }
        let start = Instant::now();
        let mut last_check = start;
        loop {
            while r < self.world && self.word(r + 1, w).load(Ordering::Acquire) >= target {
                r += 1;
            }
            if r == self.world {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited < Duration::from_micros(5) {
                std::hint::spin_loop();
                continue;
            }
            if waited < Duration::from_micros(50) {
                std::thread::yield_now();
                continue;
            }
            let v = self.fword(r).load(Ordering::SeqCst);
            self.word(0, 4).fetch_add(1, Ordering::SeqCst);
            if self.word(r + 1, w).load(Ordering::SeqCst) < target {
                futex_wait(self.fword(r), v, Duration::from_millis(10));
            }
            self.word(0, 4).fetch_sub(1, Ordering::SeqCst);
            let now = Instant::now();
            if now.duration_since(last_check) >= Duration::from_millis(10) {
                last_check = now;
                self.check_peers(op, w, target)?;
                if now.duration_since(start) >= self.timeout {
                    return Err(RuntimeError::Timeout {
                        rank: self.rank,
                        op,
                        after: self.timeout,
                        waiting_for: format!("rank {r} to reach the shared-memory barrier"),
                    });
                }
            }
        }
    }

    /// Fails if a rank whose word `w` has not yet reached `target` is dead. Ranks that arrived
    /// may legitimately exit (after the last collective of a run), so they are not checked; the
    /// arrival is read *after* the liveness probe so an arrive-then-exit peer is never blamed.
    fn check_peers(&self, op: &'static str, w: usize, target: u64) -> Result<()> {
        for (peer, pid) in self.pids.iter().enumerate() {
            if *pid <= 0 || peer == self.rank {
                continue;
            }
            if pid_alive(*pid) || self.word(peer + 1, w).load(Ordering::Acquire) >= target {
                continue;
            }
            return Err(RuntimeError::Peer {
                rank: self.rank,
                op,
                peer,
                msg: format!("process {pid} exited"),
            });
        }
        Ok(())
    }

    /// Small messages: copy in, barrier, every rank folds all slots in rank order.
    fn all_reduce_naive(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let (n, r, l) = (self.world, self.rank, buf.len());
        let set = self.next_set();
        self.slot(set, r, 0, l).copy_from_slice(buf);
        self.barrier_wait("all_reduce")?;
        buf.copy_from_slice(self.slot(set, 0, 0, l));
        for i in 1..n {
            reduce_bytes(buf, self.slot(set, i, 0, l), dtype, op);
        }
        if op == ReduceOp::Avg {
            div_bytes(buf, dtype, n);
        }
        Ok(())
    }

    /// Large messages, pipelined over pieces of one slot. Piece `g` (counted over the
    /// communicator's life, equal on every rank) uses pipeline set `g % PIPE_SETS`; rank r owns
    /// slice r of every piece. Per piece, three steps, each ending in a publication:
    ///
    /// * A (`W_IN = g+1`): copy the slices others own into my slot (my own slice is never
    ///   copied in: I read it straight from `buf`);
    /// * B (`W_RES = g+1`, after every `W_IN >= g+1`): fold slice r in rank order,
    ///   `x0 op x1 op ...`, into my slot's slice r, then copy it to `buf`;
    /// * C (`W_DONE = g+1`, after every `W_RES >= g+1`): copy every other rank's result slice
    ///   into `buf`.
    ///
    /// Order per rank: A(0), then for each piece B(k), A(k+1), C(k) — so a rank has the next
    /// piece's copy-in to do while a slower peer finishes its fold, instead of a barrier per step.
    /// A(k) overwrites a set last read in C(k - PIPE_SETS), so it first waits for every
    /// `W_DONE >= g - PIPE_SETS + 1` (already true with 3 sets unless a peer lags by a whole
    /// piece). The barrier-based collectives use their own two sets, so mixing them with this
    /// needs no extra synchronization.
    fn all_reduce_pipelined(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        const OP: &str = "all_reduce";
        let es = dtype.size();
        let piece = (self.slot / es) * es;
        let np = buf.len().div_ceil(piece) as u64;
        let g0 = self.pieces;
        let total = buf.len();
        let piece_of = |k: u64| -> std::ops::Range<usize> {
            let s = k as usize * piece;
            s..(s + piece).min(total)
        };
        self.copy_in(g0, &buf[piece_of(0)], dtype)?;
        for k in 0..np {
            let g = g0 + k;
            let set = BARRIER_SETS + (g % PIPE_SETS as u64) as usize;
            let p = &mut buf[piece_of(k)];
            let b = chunk_bounds(p.len(), es, self.world);
            let (s0, s1) = (b[self.rank], b[self.rank + 1]);
            // B: fold my slice.
            self.wait_all(W_IN, g + 1, OP)?;
            let res = self.slot(set, self.rank, s0, s1 - s0);
            if self.world == 2 && op != ReduceOp::Avg {
                // One pass: x0 op x1 into both my buffer (holding my term) and my slot.
                let peer = self.slot(set, 1 - self.rank, s0, s1 - s0);
                fold_dual_bytes(res, &mut p[s0..s1], peer, self.rank == 0, dtype, op);
            } else {
                {
                    let own = &p[s0..s1];
                    let src = |i: usize| -> &[u8] {
                        if i == self.rank {
                            own
                        } else {
                            self.slot(set, i, s0, s1 - s0)
                        }
                    };
                    reduce_into_bytes(res, src(0), src(1), dtype, op);
                    for i in 2..self.world {
                        reduce_bytes(res, src(i), dtype, op);
                    }
                }
                if op == ReduceOp::Avg {
                    div_bytes(res, dtype, self.world);
                }
                p[s0..s1].copy_from_slice(res);
            }
            self.publish(W_RES, g + 1);
            // A of the next piece while peers finish their folds.
            if k + 1 < np {
                self.copy_in(g + 1, &buf[piece_of(k + 1)], dtype)?;
            }
            // C: collect the other slices.
            self.wait_all(W_RES, g + 1, OP)?;
            let p = &mut buf[piece_of(k)];
            for i in (0..self.world).filter(|i| *i != self.rank) {
                p[b[i]..b[i + 1]].copy_from_slice(self.slot(set, i, b[i], b[i + 1] - b[i]));
            }
            self.publish(W_DONE, g + 1);
        }
        self.pieces = g0 + np;
        Ok(())
    }

    /// Step A of piece `g`: once every rank is done reading the set, copy the slices of `p` that
    /// other ranks own into my slot and publish `W_IN = g + 1`.
    fn copy_in(&self, g: u64, p: &[u8], dtype: DType) -> Result<()> {
        if g + 1 > PIPE_SETS as u64 {
            self.wait_all(W_DONE, g + 1 - PIPE_SETS as u64, "all_reduce")?;
        }
        let set = BARRIER_SETS + (g % PIPE_SETS as u64) as usize;
        let b = chunk_bounds(p.len(), dtype.size(), self.world);
        for i in (0..self.world).filter(|i| *i != self.rank) {
            self.slot(set, self.rank, b[i], b[i + 1] - b[i])
                .copy_from_slice(&p[b[i]..b[i + 1]]);
        }
        self.publish(W_IN, g + 1);
        Ok(())
    }
}

impl Drop for ShmComm {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; nothing borrows the mapping any more.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
        if self.rank == 0 {
            // Normally already unlinked after setup; this covers a failed setup.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Backend for ShmComm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        if alone(self.world, buf.len()) {
            return Ok(());
        }
        if buf.len() <= NAIVE_THRESHOLD.min(self.slot) {
            return self.all_reduce_naive(buf, dtype, op);
        }
        self.all_reduce_pipelined(buf, dtype, op)
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        if alone(self.world, buf.len()) {
            return Ok(());
        }
        let slot = self.slot;
        for p in buf.chunks_mut(slot) {
            let set = self.next_set();
            if self.rank == root {
                self.slot(set, root, 0, p.len()).copy_from_slice(p);
            }
            self.barrier_wait("broadcast")?;
            if self.rank != root {
                p.copy_from_slice(self.slot(set, root, 0, p.len()));
            }
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (n, r, l) = (self.world, self.rank, send.len());
        if all_gather_own(n, r, send, recv) {
            return Ok(());
        }
        let mut off = 0;
        while off < l {
            let pl = (l - off).min(self.slot);
            let set = self.next_set();
            self.slot(set, r, 0, pl)
                .copy_from_slice(&send[off..off + pl]);
            self.barrier_wait("all_gather")?;
            for i in (0..n).filter(|i| *i != r) {
                recv[i * l + off..i * l + off + pl].copy_from_slice(self.slot(set, i, 0, pl));
            }
            off += pl;
        }
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let (n, r, l) = (self.world, self.rank, recv.len());
        if reduce_scatter_alone(n, send, recv) {
            return Ok(());
        }
        let es = dtype.size();
        let per = (self.slot / n / es).max(1) * es;
        let mut off = 0;
        while off < l {
            let pl = (l - off).min(per);
            let set = self.next_set();
            for j in 0..n {
                self.slot(set, r, j * pl, pl)
                    .copy_from_slice(&send[j * l + off..j * l + off + pl]);
            }
            self.barrier_wait("reduce_scatter")?;
            let out = &mut recv[off..off + pl];
            out.copy_from_slice(self.slot(set, 0, r * pl, pl));
            for i in 1..n {
                reduce_bytes(out, self.slot(set, i, r * pl, pl), dtype, op);
            }
            if op == ReduceOp::Avg {
                div_bytes(out, dtype, n);
            }
            off += pl;
        }
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        self.barrier_wait("barrier")
    }
}

#[cfg(test)]
#[path = "shm_tests.rs"]
mod tests;
