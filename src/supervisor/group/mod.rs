//! The local worker group: what one node does with its own workers.
//!
//! `attempt` holds one attempt's state and its per-event methods (events in: `events`; effects
//! out: `effects`), `outcome` how an attempt ended, `restart` the restart decision. `spawn` and
//! `worker` start the workers (cold, or forked from the `warm` template; `ncclpath`,
//! `debugrank` shape their command and environment); `stop` is the stop sequence, `signals`
//! the launcher's own signals, `proctree` the workers' process trees. `contain` is the run's
//! cgroup, `checkcells` the health checks' cgroups, `deadman` the watchdog process that ends
//! the workers when rdrun dies.

pub(in crate::supervisor) mod attempt;
pub mod checkcells;
pub mod contain;
pub mod deadman;
pub mod debugrank;
pub(in crate::supervisor) mod effects;
pub(crate) mod events;
pub mod ncclpath;
pub(in crate::supervisor) mod outcome;
pub mod proctree;
pub mod restart;
pub mod signals;
pub(in crate::supervisor) mod spawn;
pub(in crate::supervisor) mod stop;
pub(in crate::supervisor) mod warm;
pub mod worker;
