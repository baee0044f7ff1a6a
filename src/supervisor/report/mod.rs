//! How a run ended and what is written about it.
//!
//! `end` is the value the run returns and its process status; `failure` the failure report (the
//! root cause rank, its traceback, the table of ranks; `failure_json.rs` its JSON);
//! `restart_cost` what each restart cost; `redact` secrets out of every command line shown; `traceback` reading tracebacks and
//! verdict lines;
//! `schema` the `--report-json` document's one type;
//! `ci` the CI outputs (GitHub Actions annotations and step summary, JUnit XML).

pub mod ci;
pub(in crate::supervisor) mod end;
pub mod failure;
pub(in crate::supervisor) mod redact;
pub(in crate::supervisor) mod restart_cost;
pub mod schema;
pub(in crate::supervisor) mod traceback;
