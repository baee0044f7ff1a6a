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
