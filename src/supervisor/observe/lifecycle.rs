//! The lifecycle event log: one JSON object per line (schema `docs/events.md`, version
//! [`SCHEMA_VERSION`]), to `<run dir>/events.jsonl` once the run directory exists (earlier events
//! are buffered until then), to `--events PATH|-`, and as text to stderr for
//! `--event-log-handler console`.
//!
//! Writes are synchronous and line-sized: the file gets each event as it happens (a consumer
//! tailing it, or a post-mortem after SIGKILL, sees every event up to the last), and a failing
//! sink is reported once and dropped, never failing the run.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::time::SystemTime;

use serde_json::{Map, Value};

/// Bumped when a field changes meaning or disappears (adding fields or events does not).
pub const SCHEMA_VERSION: u32 = 1;

/// The fields every event carries besides its own.
#[derive(Debug, Clone, Default)]
pub struct Common {
    pub run_id: String,
    pub attempt: u32,
    /// `None` until the node rank is known (before a c10d rendezvous assigns it).
    pub node_rank: Option<usize>,
    pub host: String,
}

struct Sink {
    name: String,
    out: Box<dyn Write + Send>,
}

/// Where events go.
pub struct EventLog {
    sinks: Vec<Sink>,
    console: bool,
    /// Lines waiting for the run directory (`Some` while one is expected).
    pending: Option<Vec<String>>,
}

impl EventLog {
    /// `extra`: the `--events` sink; `console`: text on stderr; `log_dir`: whether a run
    /// directory will hold `events.jsonl` (buffer until [`EventLog::run_dir`]).
    pub fn new(
        extra: Option<&crate::config::observe::EventsDest>,
        console: bool,
        log_dir: bool,
    ) -> io::Result<EventLog> {
        use crate::config::observe::EventsDest;
        let mut sinks = Vec::new();
        match extra {
            None => {}
            Some(EventsDest::Stderr) => sinks.push(Sink {
                name: "stderr".into(),
                // rdrun's own stderr text: never inside a worker's open line, never a panic.
                out: Box::new(crate::supervisor::output::own::LogWriter),
            }),
            Some(EventsDest::File(p)) => sinks.push(Sink {
                name: p.display().to_string(),
                out: Box::new(open(p).map_err(|e| {
                    io::Error::new(e.kind(), format!("--events {}: {e}", p.display()))
                })?),
            }),
        }
        Ok(EventLog {
            sinks,
            console,
            pending: log_dir.then(Vec::new),
        })
    }

    /// The run directory exists: `events.jsonl` is opened there and gets the buffered events.
    pub fn run_dir(&mut self, dir: Option<&Path>) {
        let (Some(dir), Some(pending)) = (dir, self.pending.as_mut()) else {
            return;
        };
        let path = dir.join("events.jsonl");
        match open(&path) {
            Ok(mut f) => {
                let mut ok = true;
                for line in pending.drain(..) {
                    ok &= f.write_all(line.as_bytes()).is_ok();
                }
                if !ok {
                    tracing::warn!("cannot write {}", path.display());
                }
                self.sinks.push(Sink {
                    name: path.display().to_string(),
                    out: Box::new(f),
                });
            }
            Err(e) => tracing::warn!("cannot create {}: {e}", path.display()),
        }
        self.pending = None;
    }

    /// Writes one event: `fields` after the common ones.
    pub fn emit(&mut self, common: &Common, event: &str, fields: Map<String, Value>) {
        let mut obj = Map::new();
        obj.insert("v".into(), SCHEMA_VERSION.into());
        obj.insert("ts".into(), rfc3339(SystemTime::now()).into());
        obj.insert("event".into(), event.into());
        obj.insert("run_id".into(), common.run_id.clone().into());
        obj.insert("attempt".into(), common.attempt.into());
        obj.insert(
            "node_rank".into(),
            common.node_rank.map_or(Value::Null, Value::from),
        );
        obj.insert("host".into(), common.host.clone().into());
        let text_fields = fields.clone();
        obj.extend(fields);
        let mut line = Value::Object(obj).to_string();
        line.push('\n');
        if let Some(p) = self.pending.as_mut() {
            p.push(line.clone());
        }
        self.sinks
            .retain_mut(|s| match s.out.write_all(line.as_bytes()) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "cannot write events to {}: {e}; no more events there",
                        s.name
                    );
                    false
                }
            });
        if self.console {
            crate::supervisor::output::own::stderr_line(&console_line(common, event, &text_fields));
        }
    }
}

fn open(p: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(p)
}

/// `2026-12-01T13:44:46.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The `--event-log-handler console` form: `rdrun event worker_exit attempt=0 rank=1 ...`.
fn console_line(common: &Common, event: &str, fields: &Map<String, Value>) -> String {
    let mut line = format!("rdrun event {event} attempt={}", common.attempt);
    if let Some(n) = common.node_rank {
        line.push_str(&format!(" node_rank={n}"));
    }
    for (k, v) in fields {
        if k == "config" {
            continue;
        }
        match v {
            Value::String(s) => line.push_str(&format!(" {k}={s}")),
            Value::Null => {}
            other => line.push_str(&format!(" {k}={other}")),
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_are_json_with_the_common_fields_and_buffer_until_the_run_dir() {
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("extra.jsonl");
        let mut log = EventLog::new(
            Some(&crate::config::observe::EventsDest::File(extra.clone())),
            false,
            true,
        )
        .unwrap();
        let common = Common {
            run_id: "r".into(),
            attempt: 2,
            node_rank: Some(1),
            host: "h".into(),
        };
        let f = |v: Value| v.as_object().unwrap().clone();
        log.emit(&common, "run_start", f(json!({"nproc_per_node": 2})));
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        log.run_dir(Some(&run));
        log.emit(&common, "worker_spawn", f(json!({"rank": 3, "pid": 7})));
        for path in [extra, run.join("events.jsonl")] {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines.len(), 2, "{text}");
            assert_eq!(lines[0]["event"], "run_start");
            assert_eq!(lines[1]["event"], "worker_spawn");
            assert_eq!(lines[1]["pid"], 7);
            for l in &lines {
                assert_eq!(l["v"], SCHEMA_VERSION);
                assert_eq!(l["run_id"], "r");
                assert_eq!(l["attempt"], 2);
                assert_eq!(l["node_rank"], 1);
                assert_eq!(l["host"], "h");
                let ts = l["ts"].as_str().unwrap();
                assert!(humantime::parse_rfc3339(ts).is_ok(), "{ts}");
                assert!(ts.ends_with('Z'));
            }
        }
        assert_eq!(
            console_line(
                &common,
                "worker_exit",
                &f(json!({"rank": 1, "status": "exited"}))
            ),
            "rdrun event worker_exit attempt=2 node_rank=1 rank=1 status=exited"
        );
    }

    #[test]
    fn an_unwritable_events_path_is_an_error_naming_it() {
        let err = EventLog::new(
            Some(&crate::config::observe::EventsDest::File(
                "/nonexistent-dir/e.jsonl".into(),
            )),
            false,
            false,
        )
        .err()
        .unwrap();
        assert!(err
            .to_string()
            .contains("--events /nonexistent-dir/e.jsonl"));
    }
}
