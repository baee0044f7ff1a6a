//! Every store key the launcher reads or writes, spelled once per namespace: typed constructors
//! that the drivers call instead of formatting keys themselves.
//!
//! The spellings are a wire contract: agents of one job may run different rdrun builds, the
//! c10d keys sit next to PyTorch's in the same store (`torch.rendezvous.<run_id>` is torchrun's
//! own state key, read to refuse a mixed job) and the exit barrier's are torchrun's. Each module
//! pins its spellings in tests; changing a byte of them is a protocol change.
//!
//! - [`c10d`]: `rdrun.rendezvous.<run_id>/…`, the c10d rendezvous (`c10d.rs`);
//! - [`static_`]: `rdrun.static.<run_id>/…`, the static rendezvous (`static_.rs`);
//! - `etcd`: `<prefix>/<run_id>/…` in etcd, the etcd-v2 rendezvous (`etcd/driver.rs`);
//! - [`round`]: the agent keys of one round (under [`crate::rendezvous::Assignment::store_prefix`]):
//!   the exit barrier and the multi-node hang rule's exchange.

pub(crate) mod c10d;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod round;
pub(crate) mod static_;
