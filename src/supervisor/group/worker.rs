//! One worker process, seen from the launcher: the environment and argv it gets (its
//! [`SpawnSpec`], built by [`spawn_spec`] from the launch's [`WorkerSettings`] and the round's
//! assignment), how it is spawned (own session and process group, parent-death signal, piped
//! stdout/stderr, no other descriptor), how it and its group are signalled, and how exits of
//! any descendant are reaped.
//!
//! The pure parts ([`worker_env`]) are table-tested (the per-variable rules they
//! apply live in `workerenv`: `should_set_omp_num_threads`, `virtual_local_rank_devices`);
//! the agent owns the state and calls the effectful ones ([`spawn`], [`reap`], [`signal_group`]).

use std::ffi::OsString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::config::console::ConsoleSettings;
use crate::config::numa::Binding;
use crate::config::runenv::RunEnv;
use crate::config::torchenv::TorchAgentEnv;
use crate::config::{InPlace, WorkerCommand};
use crate::exit::WorkerStatus;
use crate::rendezvous::Assignment;
use crate::workerenv::{self, VirtualDevicesError, WorkerEnv};

use crate::supervisor::group::ncclpath;
use crate::supervisor::group::warm::WarmStart;

/// Why the environment of a worker could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    /// `--virtual-local-rank` with fewer visible devices than local ranks.
    #[error(transparent)]
    Devices(#[from] VirtualDevicesError),
    /// In-place mode: the ranks' hostnames contradict the launcher's per-node counts.
    #[error("{0}")]
    InPlace(String),
}

/// Why a worker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start worker program {program:?}")]
    Exec {
        program: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl SpawnError {
    /// One line for the user: the error, its cause, and a hint where execve(2)'s ENOENT is
    /// misleading (the file exists but its `#!` interpreter or dynamic loader does not).
    pub fn describe(&self) -> String {
        let SpawnError::Exec { program, source } = self;
        let mut msg = format!("{self}: {source}");
        if source.kind() == io::ErrorKind::NotFound && program.is_file() {
            msg.push_str(" (the file exists: its interpreter or loader is missing)");
        }
        msg
    }
}

/// The variables a worker gets on top of rdrun's own environment (which it inherits whole).
///
/// `parent` reads rdrun's environment (a closure so that tests need not touch the process env).
/// Adds to the [`WorkerEnv`] contract what torchrun sets besides it (spec torchrun-compat §1.3, §2):
/// TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set, OMP_NUM_THREADS=1 when unset and nproc > 1,
/// TORCHELASTIC_SIGNALS_TO_HANDLE, and the `--virtual-local-rank` rewrite of LOCAL_RANK and
/// CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES first when set, as torchrun).
pub fn worker_env(
    env: &WorkerEnv,
    nproc_per_node: usize,
    signals_to_handle: &str,
    virtual_local_rank: bool,
    parent: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut pairs: Vec<(String, String)> = env
        .to_pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mut set = |k: &str, v: String| {
        if let Some(slot) = pairs.iter_mut().find(|(name, _)| name == k) {
            slot.1 = v;
        } else {
            pairs.push((k.to_string(), v));
        }
    };
    if parent("TORCH_NCCL_ASYNC_ERROR_HANDLING").is_none() {
        set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_string());
    }
    if workerenv::should_set_omp_num_threads(parent("OMP_NUM_THREADS").as_deref(), nproc_per_node) {
        set("OMP_NUM_THREADS", "1".to_string());
    }
    set(
        "TORCHELASTIC_SIGNALS_TO_HANDLE",
        signals_to_handle.to_string(),
    );
    if virtual_local_rank {
        set("LOCAL_RANK", "0".to_string());
        for (k, v) in workerenv::virtual_local_rank_devices(
            env.local_rank,
            parent("HIP_VISIBLE_DEVICES").as_deref(),
            parent("CUDA_VISIBLE_DEVICES").as_deref(),
        )? {
            set(k, v);
        }
    }
    Ok(pairs)
}

/// What the agent needs to start one worker.
#[derive(Debug)]
pub struct SpawnSpec {
    pub program: PathBuf,
    /// Passed to execve byte for byte.
    pub args: Vec<OsString>,
    /// Overlay on rdrun's inherited environment.
    pub env: Vec<(String, String)>,
    /// Writer end of the watchdog socket: the child registers its process group there before exec.
    pub watchdog_fd: Option<RawFd>,
    /// `cgroup.procs` of the run's cgroup: the child joins it before exec (containment hook).
    pub cgroup_fd: Option<RawFd>,
    /// The CPUs the child binds itself to before exec (`--numa-binding`, `--cpu-binding`).
    pub cpus: Option<Vec<usize>>,
    /// Whether the child reads rdrun's stdin (`--stdin`); else `/dev/null`.
    pub stdin: bool,
    /// This worker may be forked from the run's warm-start template, which the spawner owns and
    /// hands to [`spawn`] (false for the debug rank: it runs its own command).
    pub warm: bool,
    /// Another worker of the same group is spawned right after this one: a warm fork keeps
    /// its intermediate process for it (`warm::Job::more`). Set by the group's spawner.
    pub more_follow: bool,
    /// `--debug-rank`: this is the debug rank, and how to attach to it (announced once its pid
    /// is known).
    pub debug: Option<crate::supervisor::group::debugrank::Attach>,
}

/// One INFO line per local rank naming its CPU set and why (`--numa-binding`, `--cpu-binding`).
pub fn log_binding(binding: &Binding) {
    for (rank, cpus) in binding.cpus.iter().enumerate() {
        tracing::info!(
            "{}: local rank {rank} bound to CPUs {} ({})",
            binding.source,
            crate::config::numa::format_cpu_list(cpus),
            binding.why.get(rank).map_or("", String::as_str)
        );
    }
    if let Some(n) = binding.omp_threads.first() {
        tracing::info!(
            "--omp-num-threads: OMP_NUM_THREADS={n} for local rank 0 (per rank: {:?})",
            binding.omp_threads
        );
    }
}

/// What every worker of a run shares, computed once per run by the agent (its setup code).
#[derive(Debug, Clone, Default)]
pub struct RunWorkerEnv {
    /// TORCHELASTIC_SIGNALS_TO_HANDLE.
    pub signals_env: String,
    /// Extra variables (LD_LIBRARY_PATH for a pip NCCL, [`pip_nccl_env`]).
    pub extra: Vec<(String, String)>,
    /// Writer end of the watchdog socket.
    pub watchdog_fd: Option<RawFd>,
    /// `cgroup.procs` of the run's cgroup (containment).
    pub cgroup_fd: Option<RawFd>,
}

/// What a worker's spawn spec reads of the launch, built by the agent from the config for each
/// attempt (as `attempt::GroupSettings`), so that [`spawn_spec`] says what it depends on.
#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings<'a> {
    /// `--nproc-per-node`.
    pub nproc_per_node: usize,
    /// The contract's per-run values: `--role`, `--max-restarts`, the run id.
    pub role: &'a str,
    pub max_restarts: u32,
    pub run_id: &'a str,
    /// In-place mode: the scheduler's local and node values (`None`: node mode).
    pub in_place: Option<&'a InPlace>,
    /// `--virtual-local-rank`.
    pub virtual_local_rank: bool,
    /// `TORCH_ELASTIC_WORKER_IDENTICAL`, `TORCH_DISABLE_SHARE_RDZV_TCP_STORE`.
    pub torch_env: &'a TorchAgentEnv,
    /// The worker command (program, arguments, entry point kind).
    pub command: &'a WorkerCommand,
    /// `--debug-rank`, `--wrap`, `--stdin`.
    pub console: &'a ConsoleSettings,
    /// Each local rank's CPU set and OMP_NUM_THREADS.
    pub binding: &'a Binding,
    /// rdrun's environment, which every worker inherits (the per-variable rules read it).
    pub run_env: &'a RunEnv,
    /// What the agent set up once for every worker.
    pub shared: &'a RunWorkerEnv,
}

/// `TORCH_ELASTIC_WORKER_IDENTICAL=1` with nodes running different numbers of workers: torch's
/// fast path would give overlapping ranks; rdrun keeps the real ones and says so.
fn warn_if_not_identical(settings: &WorkerSettings<'_>, asg: &Assignment) {
    let nproc = settings.nproc_per_node;
    if settings.torch_env.worker_identical && !asg.uniform_nproc {
        // torch's fast path would give overlapping ranks here; rdrun keeps the real ones.
        let counts = if asg.nodes.is_empty() {
            format!(
                "{} workers in all on {} nodes",
                asg.world_size, asg.group_world_size
            )
        } else {
            format!(
                "{:?}",
                asg.nodes.iter().map(|(_, n)| *n).collect::<Vec<_>>()
            )
        };
        tracing::warn!(
            "TORCH_ELASTIC_WORKER_IDENTICAL=1 but the nodes run different numbers of workers ({counts}); ranks follow the real counts (torch would compute RANK = GROUP_RANK * {nproc} + LOCAL_RANK and overlap)"
        );
    }
}

/// The program and arguments that run rank `rank`: the worker command (`${local_rank}`
/// substituted), under debugpy for `--debug-rank` (with how to attach), inside the `--wrap`
/// wrapper where it applies.
fn worker_command(
    settings: &WorkerSettings<'_>,
    (rank, local_rank, group_rank): (usize, usize, usize),
    env: &[(String, String)],
) -> (
    PathBuf,
    Vec<OsString>,
    Option<crate::supervisor::group::debugrank::Attach>,
) {
    let command = settings.command;
    let args = command
        .args
        .iter()
        .map(|a| workerenv::substitute_local_rank(a, local_rank));
    // `--debug-rank`: the worker command under debugpy (before a wrapper, which runs it).
    let (command_program, args, debug) = if settings.console.debug_rank == Some(rank) {
        let (p, a, attach) = crate::supervisor::group::debugrank::command(
            command.kind.clone(),
            &command.program,
            args.collect(),
            local_rank,
            env,
        );
        (p, a, Some(attach))
    } else {
        (command.program.clone(), args.collect(), None)
    };
    // `--wrap`: the wrapper execs the worker command itself, so the environment, the process
    // group, the cgroup and the CPU binding set up before exec are the wrapper's and its child's,
    // and the wrapper's exit status is the rank's.
    let (program, args) = match settings.console.wrap.as_ref().filter(|w| w.applies(rank)) {
        Some(w) => {
            let mut a = w.args_for(rank, local_rank, group_rank);
            a.push(command_program.into_os_string());
            a.extend(args);
            (w.program.clone(), a)
        }
        None => (command_program, args),
    };
    (program, args, debug)
}

/// The spawn spec of local rank `local_rank` in the attempt that `asg` describes: the
/// [`WorkerEnv`] contract (ROLE_RANK/ROLE_WORLD_SIZE equal RANK/WORLD_SIZE: every node runs one
/// role), [`worker_env`]'s additions, and the command with `%local_rank%`-style substitution.
pub fn spawn_spec(
    settings: &WorkerSettings<'_>,
    asg: &Assignment,
    local_rank: usize,
    error_file: &str,
) -> Result<SpawnSpec, EnvError> {
    let nproc = settings.nproc_per_node;
    let shared = settings.shared;
    if local_rank == 0 {
        warn_if_not_identical(settings, asg);
    }
    // The worker's index in this agent's group (always 0 in place, where the agent runs one).
    let slot = local_rank;
    let (local_rank, local_world_size, group_rank, group_world_size) = match settings.in_place {
        None => (local_rank, nproc, asg.group_rank, asg.group_world_size),
        Some(p) => in_place_ids(p, asg)?,
    };
    let rank = asg.base_rank + slot;
    let contract = WorkerEnv {
        rank,
        local_rank,
        world_size: asg.world_size,
        local_world_size,
        group_rank,
        group_world_size,
        role_rank: rank,
        role_world_size: asg.world_size,
        role_name: settings.role.to_string(),
        master_addr: asg.master_addr.clone(),
        master_port: asg.master_port,
        restart_count: asg.restart_count,
        max_restarts: settings.max_restarts,
        run_id: settings.run_id.to_string(),
        // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the rank-0 worker hosts its own store.
        use_agent_store: !settings.torch_env.own_worker_store,
        error_file: error_file.to_string(),
    };
    let mut env = worker_env(
        &contract,
        nproc,
        &shared.signals_env,
        settings.virtual_local_rank,
        |k| settings.run_env.var(k),
    )?;
    env.extend(shared.extra.iter().cloned());
    if let Some(n) = settings.binding.omp_of(local_rank) {
        // Asked for on the command line: wins over an inherited value.
        env.retain(|(k, _)| k != "OMP_NUM_THREADS");
        env.push(("OMP_NUM_THREADS".into(), n.to_string()));
    }
    let (program, args, debug) = worker_command(settings, (rank, local_rank, group_rank), &env);
    Ok(SpawnSpec {
        program,
        args,
        env,
        watchdog_fd: shared.watchdog_fd,
        cgroup_fd: shared.cgroup_fd,
        cpus: settings.binding.cpus_of(local_rank).map(<[usize]>::to_vec),
        stdin: settings.console.stdin.reads(rank),
        // A warm start runs the template's own interpreter, not this command: never for the
        // debug rank.
        warm: debug.is_none(),
        more_follow: false,
        debug,
    })
}

/// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE of an in-place rank: the
/// scheduler's local values; its node index where it gave one (Slurm), else the node the ranks'
/// published hostnames put it on (`rendezvous::static_` publishes them in `Assignment::nodes`).
fn in_place_ids(p: &InPlace, asg: &Assignment) -> Result<(usize, usize, usize, usize), EnvError> {
    if let Some((g, n)) = p.node {
        return Ok((p.local_rank, p.local_world_size, g, n));
    }
    let hosts: Vec<String> = asg.nodes.iter().map(|n| n.0.clone()).collect();
    let id = crate::cluster::node_of(&hosts, asg.group_rank).ok_or_else(|| {
        EnvError::InPlace(format!(
            "in-place rank {}: the rendezvous gave no host names",
            asg.group_rank
        ))
    })?;
    if id.ranks_here != p.local_world_size {
        return Err(EnvError::InPlace(format!(
            "in-place rank {}: {} ranks name host {:?} but the launcher says {} share this node (local world size); are two machines using one hostname?",
            asg.group_rank, id.ranks_here, hosts[asg.group_rank], p.local_world_size
        )));
    }
    Ok((
        p.local_rank,
        p.local_world_size,
        id.group_rank,
        id.group_world_size,
    ))
}

/// The LOCAL_RANK the worker in agent slot `slot` was given: in place the agent's one worker is
/// its slot 0, but the worker's LOCAL_RANK is the scheduler's ([`in_place_ids`]), and every
/// place that names a local rank (output prefixes, log directories, `--tee`/`--redirects`/
/// `--local-ranks-filter`, the failure report) must name that one, as it names RANK. Node
/// mode: the slot.
pub(crate) fn reported_local_rank(in_place: Option<&InPlace>, slot: usize) -> usize {
    match in_place {
        Some(p) => p.local_rank,
        None => slot,
    }
}

/// `LD_LIBRARY_PATH` for workers when their Python environment has a pip-installed NCCL, so that
/// cudarc (which only tries `libnccl.so`) can load it (issue #6, spec runtime.md §1.4).
///
/// The environment is the worker's interpreter for Python launches, else the Python that a
/// Python launch would use (`PYTHON_EXEC`, `$VIRTUAL_ENV`, `python3` on PATH): a Rust trainer
/// started directly typically shares the venv that holds torch and its NCCL wheel. Failures only
/// log: a missing shim must never stop a launch that may not use NCCL at all.
pub fn pip_nccl_env(python: Option<&std::path::Path>, run_env: &RunEnv) -> Vec<(String, String)> {
    let Some(python) = python else {
        return Vec::new();
    };
    let Some(cache) = run_env.cache_dir.clone() else {
        return Vec::new();
    };
    let existing = run_env.ld_library_path.clone();
    match ncclpath::pip_nccl_ld_library_path(python, &cache, existing.as_deref()) {
        Ok(Some(value)) => {
            tracing::debug!(
                ?value,
                "pip NCCL found; LD_LIBRARY_PATH extended for workers"
            );
            vec![(
                "LD_LIBRARY_PATH".to_string(),
                value.to_string_lossy().into_owned(),
            )]
        }
        Ok(None) => Vec::new(),
        Err(err) => {
            tracing::warn!("could not make the pip NCCL loadable for workers: {err}");
            Vec::new()
        }
    }
}

/// A started worker: its pid (= its process group and session id) and its output pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Forked warm from the template (else started cold): for the restart's cost line.
    pub warm: bool,
}

/// Makes every descriptor above stdio that rdrun holds now close-on-exec (issue 38.9): what a
/// shell or a job system left open to rdrun (`exec 7</dev/null`, a CI runner's pipes) must not
/// reach the workers, the warm-start template (whose forks would pass it on), the health
/// checks or any other program rdrun runs. torchrun's `Popen(close_fds=True)` gives a worker
/// fds 0-2 only; so does rdrun: nothing else is passed on purpose (the template's socket is
/// made inheritable for that one exec, `warm/process.rs`). Call it first in `main`, before any
/// thread can fork: descriptors rdrun opens itself are close-on-exec already (std, tokio and
/// every `open`/`pipe2`/`socket` here ask for it), so this covers the inherited ones.
pub fn close_inherited_fds_on_exec() {
    // close_range(2) with CLOSE_RANGE_CLOEXEC (Linux 5.11): one call, nothing is closed.
    // SAFETY: plain syscall on integer arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Older kernels: each open descriptor as /proc lists it (the listing's own is made
    // close-on-exec by std, and marking it again is harmless).
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: fcntl(2) on a descriptor number; a closed one answers EBADF, nothing else.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Starts one worker in its own session and process group, with PR_SET_PDEATHSIG(SIGKILL).
///
/// Must be called on a thread that lives as long as rdrun (the main thread): Linux sends the
/// parent-death signal when the *thread* that forked the child exits (prctl(2), PR_SET_PDEATHSIG).
/// The child is not reaped by std: the agent reaps every descendant with `waitpid(-1)` ([`reap`]).
pub fn spawn(spec: &SpawnSpec, warm: Option<&WarmStart>) -> Result<Spawned, SpawnError> {
    // Warm start: forked from the template, the same `Spawned`; else (it said why) cold.
    let warm = warm.filter(|_| spec.warm);
    if let Some(f) = warm.and_then(|w| w.spawn(&warm_job(spec))) {
        return Ok(Spawned {
            pid: f.pid,
            stdout: f.stdout,
            stderr: f.stderr,
            warm: true,
        });
    }
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let parent = std::process::id() as libc::pid_t;
    let watchdog_fd = spec.watchdog_fd;
    let cgroup_fd = spec.cgroup_fd;
    // The affinity mask, built before fork (the child must not allocate).
    let mask: Option<Vec<libc::c_ulong>> = spec.cpus.as_deref().map(cpu_mask);
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe functions
    // (setsid, close_range, write, getpid, send, sched_setaffinity, prctl, getppid, raise) on
    // values captured by copy or moved in before fork (the mask, only read); it allocates
    // nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            // A worker gets stdio and nothing else (issue 38.9): also a descriptor some part
            // of rdrun opened without close-on-exec after start-up. Linux 5.11; before it,
            // `close_inherited_fds_on_exec` at start covers what rdrun inherited.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            // Containment hook: into the run's cgroup before anything can fork.
            if let Some(fd) = cgroup_fd {
                crate::supervisor::group::contain::join(fd)?;
            }
            if let Some(mask) = &mask {
                // Before exec, so the program's first thread (and every thread it starts)
                // inherits it; torch prefixes `numactl --physcpubind` for the same effect.
                let bytes = std::mem::size_of_val(mask.as_slice());
                if libc::syscall(libc::SYS_sched_setaffinity, 0, bytes, mask.as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = watchdog_fd {
                // Registers the new process group before the program runs, so that even a
                // SIGKILL of rdrun right now leaves nothing behind.
                crate::supervisor::group::deadman::register(fd, libc::getpid());
            }
            crate::supervisor::group::signals::die_with_parent(parent)
        });
    }
    let mut child = cmd.spawn().map_err(|source| SpawnError::Exec {
        program: spec.program.clone(),
        source,
    })?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    // Dropping `child` neither kills nor waits: the pid stays ours to reap.
    Ok(Spawned {
        pid: child.id() as i32,
        stdout: OwnedFd::from(stdout),
        stderr: OwnedFd::from(stderr),
        warm: false,
    })
}

/// What the warm-start template needs of `spec`.
fn warm_job(spec: &SpawnSpec) -> crate::supervisor::group::warm::Job<'_> {
    crate::supervisor::group::warm::Job {
        program: &spec.program,
        args: &spec.args,
        env: &spec.env,
        cpus: spec.cpus.as_deref(),
        stdin: spec.stdin,
        cgroup_fd: spec.cgroup_fd,
        watchdog_fd: spec.watchdog_fd,
        more: spec.more_follow,
    }
}

/// Starts the run's warm-start template (when there is one) for workers like `spec` and waits
/// for its imports (`warm::WarmStart::prestart`). Main thread only, as [`spawn`].
pub fn prestart_warm(spec: &SpawnSpec, warm: &WarmStart) {
    warm.prestart(&warm_job(spec));
}

/// A `sched_setaffinity` mask with these CPUs set (any CPU count: the kernel takes the length).
fn cpu_mask(cpus: &[usize]) -> Vec<libc::c_ulong> {
    let bits = libc::c_ulong::BITS as usize;
    let words = cpus.iter().max().map_or(1, |m| m / bits + 1);
    let mut mask = vec![0 as libc::c_ulong; words];
    for &c in cpus {
        mask[c / bits] |= 1 << (c % bits);
    }
    mask
}

/// Reaps every exited child (workers, orphaned grandchildren re-parented to rdrun as child
/// subreaper, the watchdog) without blocking; returns (pid, status) of each.
///
/// `waitpid(-1)` on purpose: as child subreaper rdrun inherits orphans whose pids it never knew,
/// and only a wildcard wait reaps them (else they stay zombies). With `__WNOTHREAD` it reaps
/// only the children of the calling thread — the main thread, which spawns every worker and
/// to which the kernel re-parents orphans — and never a helper another thread started and
/// waits for itself (the hang capture's py-spy runs on a thread of its own while the agent
/// goes on reaping). The pip NCCL probe of [`pip_nccl_env`] runs on the main thread, but only
/// before the first attempt, to completion, and `reap` runs only while an attempt is
/// supervised, so the two never overlap.
pub fn reap() -> Vec<(i32, WorkerStatus)> {
    let mut out = Vec::new();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: plain syscall with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WNOTHREAD) };
        if pid <= 0 {
            // 0: children remain but none exited; -1: ECHILD (none left) or EINTR (retry on the
            // next SIGCHLD, which is level-triggered for us since we loop until 0).
            break;
        }
        if libc::WIFEXITED(status) {
            out.push((pid, WorkerStatus::Exited(libc::WEXITSTATUS(status))));
        } else if libc::WIFSIGNALED(status) {
            out.push((pid, WorkerStatus::Signaled(libc::WTERMSIG(status))));
        }
    }
    out
}

/// Sends `sig` to process group `pgid`; false when the group no longer has members.
pub fn signal_group(pgid: i32, sig: i32) -> bool {
    // SAFETY: plain syscall; a negative pid addresses the process group (kill(2)).
    unsafe { libc::kill(-pgid, sig) == 0 }
}

/// Sends `sig` to one process; false when it does not exist.
pub fn signal_pid(pid: i32, sig: i32) -> bool {
    // SAFETY: plain syscall on a positive pid.
    pid > 0 && unsafe { libc::kill(pid, sig) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn in_place_failures_name_the_schedulers_local_rank() {
        let p = crate::config::InPlace {
            rank: 6,
            local_rank: 2,
            world_size: 8,
            local_world_size: 4,
            node: Some((1, 2)),
        };
        assert_eq!(reported_local_rank(Some(&p), 0), 2);
        assert_eq!(reported_local_rank(None, 3), 3);
    }

    fn sample(local_rank: usize, nproc: usize) -> WorkerEnv {
        WorkerEnv {
            rank: local_rank,
            local_rank,
            world_size: nproc,
            local_world_size: nproc,
            group_rank: 0,
            group_world_size: 1,
            role_rank: local_rank,
            role_world_size: nproc,
            role_name: "default".into(),
            master_addr: "127.0.0.1".into(),
            master_port: 4000,
            restart_count: 0,
            max_restarts: 0,
            run_id: "r".into(),
            use_agent_store: true,
            error_file: String::new(),
        }
    }

    fn env_of(
        lr: usize,
        nproc: usize,
        virt: bool,
        parent: &[(&str, &str)],
    ) -> Result<HashMap<String, String>, EnvError> {
        let parent: HashMap<String, String> = parent
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        worker_env(&sample(lr, nproc), nproc, "SIGTERM,SIGINT", virt, |k| {
            parent.get(k).cloned()
        })
        .map(|v| v.into_iter().collect())
    }

    #[test]
    fn env_table() {
        // (local_rank, nproc, virtual, parent env, expected subset; "-" = must be absent)
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let table: &[(usize, usize, bool, Vars, Vars)] = &[
            (
                1,
                4,
                false,
                &[],
                &[
                    ("LOCAL_RANK", "1"),
                    ("RANK", "1"),
                    ("OMP_NUM_THREADS", "1"),
                    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
                    ("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT"),
                    ("CUDA_VISIBLE_DEVICES", "-"),
                ],
            ),
            // nproc 1: OMP_NUM_THREADS untouched.
            (0, 1, false, &[], &[("OMP_NUM_THREADS", "-")]),
            // User values win (absent from the overlay, so the inherited value stays).
            (
                0,
                4,
                false,
                &[
                    ("OMP_NUM_THREADS", "8"),
                    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"),
                ],
                &[
                    ("OMP_NUM_THREADS", "-"),
                    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "-"),
                ],
            ),
            // Virtual local rank, no device list: the local rank itself.
            (
                2,
                4,
                true,
                &[],
                &[
                    ("LOCAL_RANK", "0"),
                    ("CUDA_VISIBLE_DEVICES", "2"),
                    ("RANK", "2"),
                ],
            ),
            (
                1,
                2,
                true,
                &[("CUDA_VISIBLE_DEVICES", "5,7")],
                &[("LOCAL_RANK", "0"), ("CUDA_VISIBLE_DEVICES", "7")],
            ),
            (
                1,
                2,
                true,
                &[
                    ("HIP_VISIBLE_DEVICES", "3,4"),
                    ("CUDA_VISIBLE_DEVICES", "5,7"),
                ],
                &[("HIP_VISIBLE_DEVICES", "4"), ("CUDA_VISIBLE_DEVICES", "4")],
            ),
        ];
        for (lr, nproc, virt, parent, want) in table {
            let got = env_of(*lr, *nproc, *virt, parent).expect("env");
            for (k, v) in *want {
                if *v == "-" {
                    assert!(!got.contains_key(*k), "{k} set for {lr}/{nproc}/{parent:?}");
                } else {
                    assert_eq!(
                        got.get(*k).map(String::as_str),
                        Some(*v),
                        "{k} for {parent:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn virtual_rank_without_device_entry() {
        let err = env_of(2, 3, true, &[("CUDA_VISIBLE_DEVICES", "0,1")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--virtual-local-rank: local_rank 2 exceeds available GPUs in CUDA_VISIBLE_DEVICES=0,1"
        );
    }

    #[test]
    fn affinity_masks() {
        let bits = libc::c_ulong::BITS as usize;
        assert_eq!(cpu_mask(&[]), vec![0]);
        assert_eq!(cpu_mask(&[0, 2]), vec![0b101]);
        let m = cpu_mask(&[1, bits + 3]);
        assert_eq!(m, vec![0b10, 0b1000]);
    }
}
