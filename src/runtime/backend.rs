//! The byte-level interface every collective backend implements (TCP, shared memory, NCCL host
//! staging). The typed API in [`super::group`] checks arguments and calls these.

use super::elem::{DType, ReduceOp};
use super::error::Result;

/// One communicator's collectives over raw bytes. All ranks must issue the same sequence of calls
/// with the same lengths; `recv`/`buf` lengths are checked by the caller.
pub trait Backend: Send {
    /// Short name for logs and errors ("tcp", "shm", "nccl").
    fn name(&self) -> &'static str;
    /// In-place reduction of `buf` (holding `dtype` elements) across all ranks.
    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()>;
    /// Copies `root`'s `buf` to every rank.
    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()>;
    /// `recv[r*len..(r+1)*len] = send of rank r` with `len = send.len()`.
    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// Reduces `send` (world × `recv.len()` bytes) and leaves block `rank` in `recv`.
    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<()>;
}

/// One rank, or nothing to move: the collective is done at once, on every host backend alike.
pub(crate) fn alone(world: usize, len: usize) -> bool {
    world == 1 || len == 0
}

/// The start of `all_gather` on a host backend: places this rank's own block in `recv`;
/// `true` when that is all there is to do ([`alone`]).
pub(crate) fn all_gather_own(world: usize, rank: usize, send: &[u8], recv: &mut [u8]) -> bool {
    let l = send.len();
    recv[rank * l..(rank + 1) * l].copy_from_slice(send);
    alone(world, l)
}

/// The trivial `reduce_scatter` of a host backend: with one rank (or nothing to receive) its
/// block is the front of `send`, copied to `recv`; `true` when it was.
pub(crate) fn reduce_scatter_alone(world: usize, send: &[u8], recv: &mut [u8]) -> bool {
    let l = recv.len();
    if !alone(world, l) {
        return false;
    }
    recv.copy_from_slice(&send[..l]);
    true
}
