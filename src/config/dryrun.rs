//! What `--dry-run` / `--print-topology[=json]` add to the topology (issue 25.6): not only where
//! each value came from, but what the run would do — the world size, this node's global ranks,
//! the worker command line and its interpreter, the rendezvous endpoint — and, where the real
//! run makes up a fresh run id at launch (standalone, or no `--rdzv-id` on another backend), no
//! made-up id: the dry run's own would never be used.
//!
//! Computed from the resolved [`LaunchConfig`] only, so it says what resolution decided.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use serde_json::{json, Value};

use super::command::EntrypointKind;
use super::command::{WorkerCommand, RUN_PATH_BOOTSTRAP};
use super::console::Wrap;
use super::spec::RdzvBackend;
use super::types::{LaunchConfig, RunPreview};

/// `text` as a POSIX shell reads it back: bare when it is only safe characters, else in single
/// quotes (`'` written as `'\''`).
fn shell_word(text: &OsStr) -> String {
    let b = text.as_bytes();
    let safe = !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_-./=:,@%+".contains(c));
    let s = text.to_string_lossy();
    if safe {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn backend_name(b: RdzvBackend) -> &'static str {
    match b {
        RdzvBackend::Static => "static",
        RdzvBackend::C10d => "c10d",
        RdzvBackend::Etcd => "etcd-v3",
        RdzvBackend::EtcdV2 => "etcd-v2",
    }
}

/// `a` or `a-b`.
fn span(a: usize, b: usize) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// The preview of `cfg`; `fresh_run_id`: the real run makes its id up at launch.
pub(super) fn preview(cfg: &LaunchConfig, fresh_run_id: bool) -> RunPreview {
    let (world_size, world_how, ranks, ranks_how) = world_and_ranks(cfg);
    let (command, interpreter) = command_line(&cfg.command);
    let wrapper = cfg.console.wrap.as_ref().map(wrapper_line);
    let debug_rank = cfg.console.debug_rank.map(|r| {
        format!(
            "rank {r}  (under debugpy, waiting for a client on 127.0.0.1; without debugpy it \
             runs and rdrun says how to attach)"
        )
    });
    let endpoint = match (&cfg.rdzv.endpoint, cfg.standalone) {
        (_, true) => "127.0.0.1, a free port chosen at launch (standalone)".to_string(),
        (Some(ep), false) => crate::cluster::host_port(&ep.host, &ep.port.to_string()),
        (None, false) => "none".to_string(),
    };
    RunPreview {
        world_size,
        world_how,
        ranks,
        ranks_how,
        command,
        interpreter,
        wrapper,
        debug_rank,
        endpoint,
        backend: if cfg.standalone {
            "c10d (standalone)"
        } else {
            backend_name(cfg.rdzv.backend)
        },
        run_id: (!fresh_run_id).then(|| cfg.rdzv.run_id.clone()),
    }
}

/// The world size and this node's ranks, each with how it was found: the scheduler's (in
/// place), one node, or nodes x workers (a static rendezvous knows the node's ranks; the
/// others assign them as nodes join).
fn world_and_ranks(cfg: &LaunchConfig) -> (String, String, Option<String>, String) {
    let nproc = cfg.nproc_per_node;
    let (min, max) = (cfg.nnodes.min, cfg.nnodes.max);
    if let Some(p) = &cfg.cluster.in_place {
        (
            p.world_size.to_string(),
            "the scheduler's ranks, one worker each (in place)".to_string(),
            Some(p.rank.to_string()),
            "this rdrun's rank from the scheduler".to_string(),
        )
    } else if cfg.standalone || max == 1 {
        (
            nproc.to_string(),
            format!("1 node x {nproc} workers"),
            Some(span(0, nproc - 1)),
            "the only node".to_string(),
        )
    } else {
        let world = if min == max {
            (min * nproc).to_string()
        } else {
            span(min * nproc, max * nproc)
        };
        let how = format!(
            "{} nodes x {nproc} workers, if every node runs {nproc}",
            span(min, max)
        );
        if cfg.rdzv.backend == RdzvBackend::Static {
            let base = cfg.node_rank * nproc;
            (
                world,
                how,
                Some(span(base, base + nproc - 1)),
                format!(
                    "node rank {} x {nproc} workers, if every lower node runs {nproc}",
                    cfg.node_rank
                ),
            )
        } else {
            (
                world,
                how,
                None,
                format!(
                    "assigned by the {} rendezvous as nodes join",
                    backend_name(cfg.rdzv.backend)
                ),
            )
        }
    }
}

/// The worker command as a shell line (the `--run-path` bootstrap named, not shown), and the
/// interpreter that runs it (none for a plain executable).
fn command_line(c: &WorkerCommand) -> (String, Option<String>) {
    let mut words = vec![shell_word(c.program.as_os_str())];
    for a in &c.args {
        if c.kind == EntrypointKind::RunPath && a.as_bytes() == RUN_PATH_BOOTSTRAP.as_bytes() {
            words.push("<run-path bootstrap>".into());
        } else {
            words.push(shell_word(a));
        }
    }
    let interpreter = match c.kind {
        EntrypointKind::Exec => None,
        _ => c.python.as_ref().map(|p| p.display().to_string()),
    };
    (words.join(" "), interpreter)
}

/// The `--wrap` wrapper as a shell line, and the ranks it wraps.
fn wrapper_line(w: &Wrap) -> String {
    let mut words = vec![shell_word(w.program.as_os_str())];
    words.extend(w.args.iter().map(|a| shell_word(OsStr::new(a))));
    let ranks = match &w.ranks {
        None => "every rank".to_string(),
        Some(r) => format!(
            "ranks {}",
            r.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
        ),
    };
    format!("{}  ({ranks})", words.join(" "))
}

impl RunPreview {
    /// The rows the text block prints after the topology's fields.
    pub fn text(&self) -> String {
        let row = |name: &str, value: &str, how: &str| {
            if how.is_empty() {
                format!("rdrun:   {name:<16} {value}\n")
            } else {
                format!("rdrun:   {name:<16} {value}  ({how})\n")
            }
        };
        let mut s = String::from("rdrun: run (what the launch would do)\n");
        s.push_str(&row("world_size", &self.world_size, &self.world_how));
        s.push_str(&row(
            "global_ranks",
            self.ranks.as_deref().unwrap_or("at the rendezvous"),
            &self.ranks_how,
        ));
        s.push_str(&row("rendezvous", &self.endpoint, self.backend));
        // A known run id is the topology's own row (with its source); only its absence is said.
        if self.run_id.is_none() {
            s.push_str(&row(
                "run_id",
                "a fresh one at launch",
                "made up by each real run",
            ));
        }
        s.push_str(&row("command", &self.command, ""));
        s.push_str(&row(
            "interpreter",
            self.interpreter
                .as_deref()
                .unwrap_or("none (the program runs directly)"),
            "",
        ));
        if let Some(w) = &self.wrapper {
            s.push_str(&row("wrapper", w, ""));
        }
        if let Some(d) = &self.debug_rank {
            s.push_str(&row("debug_rank", d, ""));
        }
        s
    }

    /// The `"run"` object of the JSON form; `null` where a value is not known before the run.
    pub fn json(&self) -> Value {
        json!({
            "world_size": self.world_size,
            "world_size_how": self.world_how,
            "global_ranks": self.ranks,
            "global_ranks_how": self.ranks_how,
            "rendezvous": {"endpoint": self.endpoint, "backend": self.backend},
            "run_id": self.run_id,
            "command": self.command,
            "interpreter": self.interpreter,
            "wrapper": self.wrapper,
            "debug_rank": self.debug_rank,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::shell_word;
    use std::ffi::OsStr;

    fn dry(argv: &[&str], env: &[(&str, &str)]) -> (super::RunPreview, String) {
        let c = resolve_env(argv, env, &FakeHost::new()).expect("resolves");
        let run = c.cluster.run.clone().expect("a dry run has a preview");
        (run, c.cluster.banner().expect("a dry run prints"))
    }

    #[test]
    fn a_local_dry_run_says_what_it_would_run_and_makes_no_run_id_up() {
        let (run, text) = dry(
            &["--dry-run", "--nproc-per-node", "2", "t.py", "--lr", "a b"],
            &[],
        );
        assert_eq!(run.world_size, "2");
        assert_eq!(run.ranks.as_deref(), Some("0-1"));
        assert_eq!(run.command, "/usr/bin/python3 -u t.py --lr 'a b'");
        assert_eq!(run.interpreter.as_deref(), Some("/usr/bin/python3"));
        assert_eq!(run.run_id, None, "standalone makes a fresh id at launch");
        assert!(
            !text.contains("abababab"),
            "the dry run's own made-up id is not shown: {text}"
        );
        for want in [
            "rdrun:   world_size       2  (1 node x 2 workers)\n",
            "rdrun:   global_ranks     0-1  (the only node)\n",
            "rdrun:   rendezvous       127.0.0.1, a free port chosen at launch (standalone)  (c10d (standalone))\n",
            "rdrun:   run_id           a fresh one at launch  (made up by each real run)\n",
            "rdrun:   command          /usr/bin/python3 -u t.py --lr 'a b'\n",
            "rdrun:   interpreter      /usr/bin/python3\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        assert!(!text.contains("wrapper"), "{text}");
        // --wrap: the wrapper and its ranks.
        let (run, text) = dry(
            &[
                "--dry-run",
                "--nproc-per-node",
                "4",
                "--wrap",
                "true -o 'a b.%r'",
                "--wrap-ranks",
                "2,0",
                "t.py",
            ],
            &[],
        );
        assert_eq!(
            run.wrapper.as_deref(),
            Some("/bin/true -o 'a b.%r'  (ranks 0,2)")
        );
        assert!(
            text.contains("rdrun:   wrapper          /bin/true -o 'a b.%r'  (ranks 0,2)\n"),
            "{text}"
        );
        assert!(!text.contains("debug_rank"), "{text}");
        // --debug-rank: the rank that waits for a debugger.
        let (run, text) = dry(
            &[
                "--dry-run",
                "--nproc-per-node",
                "2",
                "--debug-rank",
                "1",
                "t.py",
            ],
            &[],
        );
        assert!(run
            .debug_rank
            .as_deref()
            .is_some_and(|d| d.starts_with("rank 1  (under debugpy")));
        assert!(
            text.contains("rdrun:   debug_rank       rank 1  (under debugpy"),
            "{text}"
        );
        // A program run directly has no interpreter.
        let (run, _) = dry(&["--dry-run", "/bin/true"], &[]);
        assert_eq!((run.command.as_str(), run.interpreter), ("/bin/true", None));
        // --run-path's bootstrap program is not printed in full.
        let (run, _) = dry(&["--dry-run", "--run-path", "t.py"], &[]);
        assert_eq!(
            run.command,
            "/usr/bin/python3 -u -c <run-path bootstrap> t.py"
        );
    }

    #[test]
    fn a_multi_node_dry_run_gives_this_nodes_ranks_and_endpoint() {
        let argv = [
            "--print-topology=json",
            "--nnodes",
            "3",
            "--node-rank",
            "1",
            "--nproc-per-node",
            "4",
            "--master-addr",
            "h0",
            "--master-port",
            "29511",
            "--rdzv-id",
            "job7",
            "t.py",
        ];
        let (run, text) = dry(&argv, &[]);
        assert_eq!(run.world_size, "12");
        assert_eq!(run.ranks.as_deref(), Some("4-7"));
        assert_eq!(run.endpoint, "h0:29511");
        assert_eq!(run.backend, "static");
        assert_eq!(run.run_id.as_deref(), Some("job7"));
        let j: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(j["run"]["global_ranks"], "4-7");
        assert_eq!(j["run"]["rendezvous"]["endpoint"], "h0:29511");
        assert_eq!(j["fields"]["run_id"]["value"], "job7");
        // c10d assigns ranks as nodes join; an elastic range gives a range of world sizes; the
        // run id is torchrun's default `none`, the real run's too.
        let (run, text) = dry(
            &[
                "--dry-run",
                "--nnodes",
                "2:4",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "[fd00::1]:29400",
                "t.py",
            ],
            &[],
        );
        assert_eq!((run.world_size.as_str(), run.ranks), ("2-4", None));
        assert_eq!(run.endpoint, "[fd00::1]:29400");
        assert_eq!(run.run_id.as_deref(), Some("none"));
        assert!(
            text.contains("rdrun:   global_ranks     at the rendezvous  (assigned by the c10d rendezvous as nodes join)\n"),
            "{text}"
        );
        // `--rdzv-id ""`: the real run makes one up (torchrun's rule), so none is shown.
        let (run, _) = dry(
            &[
                "--dry-run",
                "--nnodes",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "h0",
                "--rdzv-id",
                "",
                "t.py",
            ],
            &[],
        );
        assert_eq!(run.run_id, None);
    }

    #[test]
    fn shell_words_read_back_as_typed() {
        assert_eq!(shell_word(OsStr::new("train.py")), "train.py");
        assert_eq!(shell_word(OsStr::new("--lr=0.1")), "--lr=0.1");
        assert_eq!(shell_word(OsStr::new("a b")), "'a b'");
        assert_eq!(shell_word(OsStr::new("it's")), r"'it'\''s'");
        assert_eq!(shell_word(OsStr::new("")), "''");
    }
}
