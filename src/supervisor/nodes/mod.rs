//! The coordination between nodes of a multi-node run.
//!
//! `join` is the agent's side of the rendezvous (rounds, the exit barrier); `health_gate` what
//! a node's health checks do to the run, `outside` an unhealthy node waiting outside it;
//! `network_check` the pre-check after a round and a node leaving; `failure_counts` and
//! `root_cause` what every node shares through the run's exchange; `stop_verdict` what "the
//! same failure" means and the count the restart decision reads.

pub(in crate::supervisor) mod failure_counts;
pub(in crate::supervisor) mod health_gate;
pub(in crate::supervisor) mod join;
pub(in crate::supervisor) mod network_check;
pub(in crate::supervisor) mod outside;
pub(in crate::supervisor) mod root_cause;
pub mod stop_verdict;
