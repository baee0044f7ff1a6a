//! Hang detection (issue 13): sample each rank's activity, decide when the whole job is quiet
//! past its budget, then capture every rank's state — Python stack, kernel waits, last output —
//! name the suspect rank and print one block, before anything is stopped.
//!
//! Used by the watch task (`supervisor/watch/task.rs`, one attempt's detection in
//! `watch/link.rs`: poll, capture, files, the block the observer prints; kill mode takes the
//! failure path in the attempt), the `--hang-*` flags, and the FileTimer server
//! (`watch/timers.rs`; its messages reach the detector as activity, and `rdrun/` scopes with
//! signal 0 as heartbeats with a budget), store-wait capture, and the deletion of torch's
//! fatal-dump store keys before each attempt (`watch/files.rs`).
//! The pieces:
//! * [`settings`]: [`HangSettings`] (defaults: kill mode, 900 s steady / 1800 s startup budget,
//!   300 s exit skew, 5 s poll, 5 % CPU, 64 KiB I/O; 20 s capture bound) and the parsers for
//!   `off|observe|kill`, durations and `RDRUN_HANG_*` variables.
//! * [`sample`]: per-rank `/proc` sampling of the whole process tree behind [`ProcSource`], and
//!   the [`OutputCounter`] the output pump bumps.
//! * [`detector`]: the pure rules ([`Detector`]) and the poll-driven [`HangMonitor`].
//! * [`capture`](mod@capture): bounded, parallel capture, the stderr block and `rank<R>.txt` files
//!   ([`capture()`], [`HangReport`]); [`children`]: each rank's Python descendants
//!   (DataLoader workers) and their stacks, captured with the rank; [`record`]: what a capture
//!   records for a rank; [`pyspy`]: running py-spy and reading its text.
//! * [`frames`]: a py-spy frame's origin (the user's code, the stdlib, site-packages) and what a
//!   stack waits in; [`suspect`]: the pure rules naming the rank to blame.
//! * [`cluster`]: the multi-node rule — every agent publishes its node's quiet state to the
//!   rendezvous store, the job hangs only when every node is quiet, one verdict per round;
//!   without the store, the local rule at twice the budget.
//! * [`filetimer`]: torch's FileTimer protocol — line parser, timer table, FIFO reader task.
//!   Expiry handling (capture that rank with [`capture()`], then signal only the process in the
//!   worker tree that armed the timer, never rdrun) is the watch task's and the attempt's job.

pub mod capture;
pub mod children;
pub mod cluster;
pub mod detector;
pub mod filetimer;
pub mod frames;
pub mod pyspy;
pub mod record;
pub mod sample;
pub mod suspect;
/// The settings are resolved flags, so `config` owns them (see docs/architecture.md).
pub use crate::config::hang as settings;

pub use capture::{capture, CaptureOptions, CaptureTarget, HangReport, StackStatus};
pub use detector::{Detector, HangMonitor, HangReason, NodeQuiet, Phase, TimerExpiry, Verdict};
pub use filetimer::{TimerFifo, TimerMsg, TimerTable};
pub use sample::{OutputCounter, ProcFs, ProcSource, RankProcs, RankSample};
pub use settings::{parse_duration, HangMode, HangSettings};
