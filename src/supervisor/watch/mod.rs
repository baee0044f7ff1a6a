//! Watching the workers: hang detection, the D-state check and torch's FileTimer server, as one
//! task of their own ([`task::Watch`]) that samples, judges and captures, and sends verdicts to
//! the agent as events. Nothing here reaches into the attempt, signals a worker or prints.
//!
//! * [`task`]: the task, its commands (an attempt's ranks, exits, pause) and its verdicts.
//! * [`verdict`]: what a verdict carries ([`verdict::HangFinding`], [`verdict::WatchVerdict`]).
//! * [`link`]: one attempt's hang detection (the monitor, the multi-node rule, the capture).
//! * [`dstate`]: the check behind `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`.
//! * [`timers`]: torch's FileTimer FIFO and table, and the capture of an expired process.
//! * [`files`]: where captures go, and torch's fatal-dump keys cleared between attempts.
//! * [`hang`]: the detection library (sampling `/proc`, the pure rules, py-spy, the suspect
//!   rules, rendering).

pub(crate) mod dstate;
pub(crate) mod files;
pub mod hang;
pub(crate) mod link;
pub(crate) mod task;
pub(crate) mod timers;
pub(crate) mod verdict;
