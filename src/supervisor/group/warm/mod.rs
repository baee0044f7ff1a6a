//! Warm starts (`--warm-start`, docs/warm-start.md): Python workers forked from a per-node
//! template interpreter that imported torch (and `--preload`) once, instead of exec'd cold.
//!
//! [`WarmStart`] is the run's one template manager: `worker::spawn` asks it first and spawns
//! cold when it says no. It starts the template at the first spawn (with the first worker's
//! environment minus the per-rank variables), keeps it across restarts, replaces it when it
//! died, refuses (cold, one line per reason) when a variable read at import time differs for a
//! worker or the template has a thread not known to be fork-safe, and ends it with the run
//! (drop; the run's cgroup, PR_SET_PDEATHSIG and the watchdog cover a killed rdrun). Once per
//! run it says at the default level that workers are forked warm, and from what.
//! `process.rs` owns the template process and the wire protocol, `template.py` the other side
//! (including what a forked worker makes for itself: docs/warm-start.md "Parity"), `learn.py`
//! the learned preload (`learned.rs`: its directory and memory file), `importvars.rs` the
//! variables read at import and the rule for them.

mod importvars;
mod learned;
mod process;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::warm::{WarmMode, WarmSettings};
use crate::config::{EntrypointKind, WorkerCommand};

use importvars::{import_time_difference, template_env};
use learned::{memory_file, memory_key, LearnDir};
use process::{Reply, Request, Template, TemplateError, TemplateStart};

/// How long the template may take to import its preload list (`import torch` took up to 20 s
/// on a loaded 2-core machine and is reported at 11–78 s on shared file systems).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// A fork request's answer (the fork itself takes milliseconds; the thread check may retry).
const FORK_TIMEOUT: Duration = Duration::from_secs(30);
/// Templates started per run at most (the first and replacements of dead ones).
const MAX_TEMPLATES: u32 = 4;

/// What a fork needs of the worker's spawn spec (`worker::SpawnSpec`'s fields).
pub struct Job<'a> {
    pub program: &'a Path,
    pub args: &'a [OsString],
    /// Overlay on rdrun's environment.
    pub env: &'a [(String, String)],
    pub cpus: Option<&'a [usize]>,
    /// Whether the worker reads rdrun's stdin (`--stdin`); else it gets `/dev/null`, as a cold
    /// worker does.
    pub stdin: bool,
    pub cgroup_fd: Option<RawFd>,
    pub watchdog_fd: Option<RawFd>,
    /// rdrun asks for another worker right after this one (a group's next local rank): one
    /// intermediate process forks both (template.py `_serve`).
    pub more: bool,
}

/// A worker forked from the template: its pid (= process group and session) and the read
/// ends of its stdout and stderr pipes.
pub struct Forked {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// The run's template manager (shared by every spawn spec of the run).
pub struct WarmStart {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for WarmStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WarmStart")
    }
}

struct Inner {
    mode: WarmMode,
    preload: Vec<String>,
    /// Where the learned list is remembered across runs (`config::warm`).
    memory: Option<std::path::PathBuf>,
    /// The workers' reports of what they import; `None`: the template learns nothing.
    learn: Option<LearnDir>,
    template: Option<Template>,
    /// The run holds a rendezvous: a spawn must never block on a template's imports (the
    /// agent's one thread would miss the round's heartbeats), so a replacement template
    /// imports in the background and workers start cold until it is ready.
    in_rounds: bool,
    /// A replacement template still importing (`in_rounds` only).
    importing: Option<(Template, std::time::Instant)>,
    /// Templates started so far.
    started: u32,
    /// Warm start given up for the rest of the run.
    off: bool,
    /// Reasons already said (each once per run).
    said: Vec<String>,
    /// The run's line saying that workers are forked warm, and from what, was printed.
    announced: bool,
    /// The last fork said another would follow (`Job::more`): the template's intermediate
    /// waits for it, and must be told when the next worker is not forked after all.
    burst: bool,
}

impl WarmStart {
    /// The manager for a run of `command` with these warm-start settings; `None` when warm start
    /// is off or the worker is not a Python program (said once when `--warm-start on` asked for
    /// it). `temp_dir`: the run's TMPDIR (resolved once in config); `in_rounds`: the run holds a
    /// rendezvous (`LaunchConfig::uses_rendezvous`).
    pub fn for_run(
        settings: &WarmSettings,
        command: &WorkerCommand,
        temp_dir: &Path,
        in_rounds: bool,
    ) -> Option<Arc<WarmStart>> {
        let WarmSettings {
            mode,
            preload,
            memory,
        } = settings;
        if *mode == WarmMode::Off {
            return None;
        }
        let python = matches!(
            command.kind,
            EntrypointKind::PythonScript | EntrypointKind::PythonModule | EntrypointKind::RunPath
        );
        if !python {
            let msg = format!(
                "warm start: {} is not run by python (--no-python or a program); workers start cold",
                command.display_name
            );
            match mode {
                WarmMode::On => tracing::warn!("{msg}"),
                _ => tracing::info!("{msg}"),
            }
            return None;
        }
        // Where the workers report what they import (learn.py): a private directory of this
        // run's, removed with the manager.
        let learn = LearnDir::create(temp_dir)
            .map_err(|e| {
                tracing::info!("warm start: no learned preload (cannot make its directory: {e})")
            })
            .ok();
        Some(Arc::new(WarmStart {
            inner: Mutex::new(Inner {
                mode: *mode,
                preload: preload.clone(),
                memory: memory.clone(),
                learn,
                template: None,
                in_rounds,
                importing: None,
                started: 0,
                off: false,
                said: Vec::new(),
                announced: false,
                burst: false,
            }),
        }))
    }

    /// The run's private directory where the workers report their imports, if any: the
    /// agent has the watchdog remove it should rdrun die without dropping this manager.
    pub fn learn_dir(&self) -> Option<std::path::PathBuf> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.learn.as_ref().map(|l| l.path.clone())
    }

    /// Forks the worker of `spec` from the template; `None`: spawn it cold (the reason was
    /// said, once per kind of reason).
    pub fn spawn(&self, spec: &Job<'_>) -> Option<Forked> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.spawn(spec)
    }

    /// Starts the template now, for workers like `spec` (local rank 0 of a placeholder
    /// assignment), and waits for its imports: the agent calls it before the first rendezvous,
    /// while this node is in no round whose heartbeats a blocked agent would miss. The first
    /// real spawn then finds it ready (it checks the import-time variables as always).
    pub fn prestart(&self, spec: &Job<'_>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.off {
            inner.ensure_template(spec, true);
        }
    }
}

impl Drop for WarmStart {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(mut t) = inner.template.take() {
            // What it learned or skipped since the last fork (INFO lines).
            t.drain_notes();
            end(&mut t);
        }
        if let Some((mut t, _)) = inner.importing.take() {
            end(&mut t);
        }
    }
}

/// Ends the template and forgets it in the process tree's helper list.
fn end(t: &mut Template) {
    t.end();
    crate::supervisor::group::proctree::forget_helper(t.pid);
}

/// How long rdrun waits for its own shutdown signal before it says that warm start is off (a
/// template that died of `scancel`'s SIGTERM: Slurm signals every process of the step in no
/// set order).
const SHUTDOWN_SETTLE: Duration = Duration::from_millis(200);

impl Inner {
    fn say(&mut self, key: &str, msg: String) {
        if self.said.iter().any(|k| k == key) {
            return;
        }
        // What a shutdown does to the template (its signal ends it mid-import) is no reason to
        // tell the user about warm start: the run is ending (issue 38 item 17).
        if crate::supervisor::group::signals::shutdown_seen() {
            tracing::debug!("warm start during a shutdown: {msg}");
            return;
        }
        self.said.push(key.to_string());
        match self.mode {
            WarmMode::On => tracing::warn!("warm start: {msg}"),
            _ => tracing::info!("warm start: {msg}"),
        }
    }

    /// A template is ready: an INFO line for each, and for the run's first one line at the
    /// default level (rdrun's own line on stderr, as the debug-rank and status lines: the
    /// default log filter shows only warnings, and this is none) saying that workers are forked
    /// warm and from what; each reason to start cold says itself (`say`).
    fn ready(&mut self, t: &Template, took: Duration) {
        tracing::info!(
            "warm start: template interpreter pid {} ready in {:.2} s",
            t.pid,
            took.as_secs_f64()
        );
        if std::mem::replace(&mut self.announced, true) {
            return;
        }
        let holds = if t.holds.is_empty() {
            String::new()
        } else {
            format!(": {}", t.holds)
        };
        let learns = if self.learn.is_some() {
            "; it imports what they import, for the next forks"
        } else {
            ""
        };
        crate::supervisor::output::own::stderr_line(&format!(
            "rdrun warm start: workers are forked from a template interpreter (pid {}{holds}), ready in {:.2} s{learns}",
            t.pid,
            took.as_secs_f64()
        ));
    }

    /// The template's options (template.py `_OPTS`): bare under `auto` without `--preload`
    /// (torch only once the workers are known to import it, so that a job that never does
    /// pays nothing for it), where the workers report their imports, and the memory's key.
    fn template_options(&self, spec: &Job<'_>) -> Vec<(&'static str, OsString)> {
        let mut out = Vec::new();
        if self.mode == WarmMode::Auto && self.preload.is_empty() {
            out.push(("bare", OsString::new()));
        }
        let Some(learn) = &self.learn else {
            return out;
        };
        out.push(("learn", learn.path.clone().into_os_string()));
        if let Some(memory) = &self.memory {
            let (key, script) = memory_key(spec.program, spec.args);
            out.push(("memory", memory_file(memory, &key).into_os_string()));
            if let Some(script) = script {
                out.push(("script", script.into_os_string()));
            }
        }
        out
    }

    fn give_up(&mut self, msg: String) {
        self.off = true;
        if let Some(mut t) = self.template.take() {
            end(&mut t);
        }
        if let Some((mut t, _)) = self.importing.take() {
            end(&mut t);
        }
        crate::supervisor::group::signals::shutdown_seen_within(SHUTDOWN_SETTLE);
        self.say(
            "off",
            format!("{msg}; workers start cold for the rest of the run"),
        );
    }

    fn spawn(&mut self, spec: &Job<'_>) -> Option<Forked> {
        let open = std::mem::take(&mut self.burst);
        let mut asked = false;
        let forked = self.spawn_asking(spec, &mut asked);
        if open && !asked {
            if let Some(t) = self.template.as_mut() {
                t.end_burst();
            }
        }
        forked
    }

    /// [`Inner::spawn`]; `asked`: a fork request was sent (an open burst's intermediate took it).
    fn spawn_asking(&mut self, spec: &Job<'_>, asked: &mut bool) -> Option<Forked> {
        // Before the first rendezvous the agent waited for the first template (`prestart`);
        // a template started later imports in the background when rounds are at stake.
        let wait = !self.in_rounds || self.started == 0;
        if self.off || !self.ensure_template(spec, wait) {
            return None;
        }
        let t = self.template.as_mut().expect("ensured above");
        if let Some(var) = import_time_difference(&t.env, spec.env) {
            self.say(
                &format!("env {var}"),
                format!("{var} differs between the workers, and it is read when the template imports; those workers start cold"),
            );
            return None;
        }
        *asked = true;
        match fork(t, spec) {
            Ok(Ok(spawned)) => {
                self.burst = spec.more;
                Some(spawned)
            }
            Ok(Err(reason)) => {
                self.say(
                    &format!("cold {reason}"),
                    format!("{reason}; workers start cold"),
                );
                None
            }
            Err(err) => {
                let mut t = self.template.take().expect("present");
                end(&mut t);
                self.say(
                    "gone",
                    format!("{err}; this worker starts cold, the next from a new template"),
                );
                None
            }
        }
    }

    /// A live, ready template (started now when there is none: waiting for its imports when
    /// `wait`, else importing in the background); false when none is ready (said why).
    fn ensure_template(&mut self, spec: &Job<'_>, wait: bool) -> bool {
        if let Some((t, began)) = self.importing.as_mut() {
            match t.ready_now() {
                None if began.elapsed() > START_TIMEOUT => {
                    let (mut t, _) = self.importing.take().expect("present");
                    end(&mut t);
                    self.give_up(format!(
                        "the template interpreter did not finish its imports within {} s",
                        START_TIMEOUT.as_secs()
                    ));
                    return false;
                }
                None => {
                    self.say(
                        "importing",
                        "a new template interpreter is importing; workers start cold until it is ready"
                            .into(),
                    );
                    return false;
                }
                Some(Ok(())) => {
                    let took = began.elapsed();
                    let (t, _) = self.importing.take().expect("present");
                    self.ready(&t, took);
                    self.template = Some(t);
                }
                Some(Err(err)) => {
                    let (t, _) = self.importing.take().expect("present");
                    crate::supervisor::group::proctree::forget_helper(t.pid);
                    self.give_up(err.to_string());
                    return false;
                }
            }
        }
        if self.template.as_ref().is_some_and(|t| !t.alive()) {
            let mut t = self.template.take().expect("checked");
            end(&mut t);
            self.say(
                "died",
                format!(
                    "the template interpreter (pid {}) died; starting a new one",
                    t.pid
                ),
            );
        }
        if self.template.is_none() {
            if self.started >= MAX_TEMPLATES {
                self.give_up(format!("{MAX_TEMPLATES} template interpreters died"));
                return false;
            }
            self.started += 1;
            let start = TemplateStart {
                python: spec.program.to_path_buf(),
                env: template_env(spec.env),
                path0: path0(spec.args),
                preload: self.preload.clone(),
                options: self.template_options(spec),
                code_cache: self.memory.clone(),
                worker_cmdline: std::iter::once(spec.program.as_os_str().to_owned())
                    .chain(spec.args.iter().cloned())
                    .collect(),
                cgroup_fd: spec.cgroup_fd,
                watchdog_fd: spec.watchdog_fd,
            };
            let began = std::time::Instant::now();
            if !wait {
                return match Template::launch(&start) {
                    Ok(t) => {
                        crate::supervisor::group::proctree::note_helper(t.pid);
                        self.importing = Some((t, began));
                        self.say(
                            "importing",
                            "a new template interpreter is importing; workers start cold until it is ready"
                                .into(),
                        );
                        false
                    }
                    Err(err) => {
                        self.give_up(err.to_string());
                        false
                    }
                };
            }
            match Template::start(&start, START_TIMEOUT) {
                Ok(t) => {
                    self.ready(&t, began.elapsed());
                    crate::supervisor::group::proctree::note_helper(t.pid);
                    self.template = Some(t);
                }
                Err(err) => {
                    self.give_up(err.to_string());
                    return false;
                }
            }
        }
        true
    }
}

/// One fork request: the worker's pipes made here, its stdio ends passed to the template.
/// `Ok(Err(reason))`: the template declined; `Err`: the template is unusable.
fn fork(t: &mut Template, spec: &Job<'_>) -> Result<Result<Forked, String>, TemplateError> {
    let pipes = (|| -> std::io::Result<_> {
        let out = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let err = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok((out, err))
    })();
    let ((out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("cannot make the worker's pipes: {e}"))),
    };
    let cwd = match std::env::current_dir() {
        Ok(c) => c,
        Err(e) => return Ok(Err(format!("cannot read the working directory: {e}"))),
    };
    let env = crate::workerenv::inherited_env_with(spec.env);
    // What a cold spawn gives: rdrun's stdin to a rank that reads it (none when rdrun's fd 0 is
    // closed), `/dev/null` to every other rank (`--stdin N|none`).
    let devnull;
    let stdin = if spec.stdin {
        // SAFETY: fcntl(2) F_GETFD only asks whether fd 0 is open.
        (unsafe { libc::fcntl(0, libc::F_GETFD) } != -1).then_some(0)
    } else {
        devnull = match std::fs::File::open("/dev/null") {
            Ok(f) => f,
            Err(e) => return Ok(Err(format!("cannot open /dev/null for stdin: {e}"))),
        };
        Some(devnull.as_raw_fd())
    };
    let req = Request {
        cwd: &cwd,
        cpus: spec.cpus,
        args: spec.args,
        env: &env,
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        stdin,
        more: spec.more,
    };
    let reply = t.fork(&req, FORK_TIMEOUT)?;
    // The template holds its copies now (or declined): ours must close, or EOF never comes.
    drop((out_w, err_w));
    match reply {
        Reply::Pid(pid) => {
            if let Some(fd) = spec.watchdog_fd {
                // The worker leads its own process group, as a cold one.
                crate::supervisor::group::deadman::register(fd, pid);
            }
            tracing::debug!(pid, "worker forked from the template");
            Ok(Ok(Forked {
                pid,
                stdout: out_r,
                stderr: err_r,
            }))
        }
        Reply::Cold(reason) => Ok(Err(reason)),
    }
}

/// The workers' `sys.path[0]` for the interpreter arguments rdrun builds: the script's
/// directory (symlinks resolved, as python), the working directory for `-m`, empty for `-c`.
fn path0(args: &[OsString]) -> OsString {
    match args.get(1).and_then(|a| a.to_str()) {
        Some("-c") => OsString::new(),
        Some("-m") => std::env::current_dir()
            .map(|d| d.into_os_string())
            .unwrap_or_default(),
        _ => args
            .get(1)
            .and_then(|s| std::fs::canonicalize(s).ok())
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .map(|d| d.into_os_string())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_path_zero() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(path0(&os(&["-u", "-c", "code"])), OsString::new());
        let cwd = std::env::current_dir().unwrap().into_os_string();
        assert_eq!(path0(&os(&["-u", "-m", "pkg.mod"])), cwd);
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("t.py");
        std::fs::write(&script, "").unwrap();
        let want = std::fs::canonicalize(dir.path()).unwrap().into_os_string();
        assert_eq!(
            path0(&[OsString::from("-u"), script.into_os_string()]),
            want
        );
    }
}
