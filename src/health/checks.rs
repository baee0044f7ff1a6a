//! The built-in checks, each a one-line verdict: the worker interpreter starts; free space in
//! the log directory; `/dev/shm` and available memory against the node's worker count; the
//! open-file limit; the GPUs `nvidia-smi` lists against `--nproc-per-node`; the NICs named by
//! `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME` are up; and the site's `--health-check-cmd`.
//! The thresholds are floors that catch a broken node (a full disk, a container's 64 MiB
//! `/dev/shm`, a 256 open-file limit), not a sizing tool.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::command::{describe, run_bounded, Ran};
use super::{Inputs, Status, Verdict};

/// The floors the checks compare against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Free bytes the log directory's file system must have.
    pub log_dir_free: u64,
    /// Free bytes the checkpoint directory's file system must have (a checkpoint is large).
    pub checkpoint_dir_free: u64,
    /// Free `/dev/shm` bytes per local worker (NCCL's and DataLoader's shared memory).
    pub shm_per_worker: u64,
    /// `MemAvailable` bytes per local worker (low: a launch of many small workers is fine; a
    /// node about to run out of memory is not).
    pub mem_per_worker: u64,
    /// The open-file soft limit (after rdrun raised it to the hard one).
    pub nofile: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        const MIB: u64 = 1 << 20;
        Thresholds {
            log_dir_free: 100 * MIB,
            checkpoint_dir_free: 1024 * MIB,
            shm_per_worker: 32 * MIB,
            mem_per_worker: 64 * MIB,
            nofile: 1024,
        }
    }
}

fn verdict(check: &'static str, t0: Instant, status: Status, detail: String) -> Verdict {
    Verdict {
        check,
        status,
        detail,
        took: t0.elapsed(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// The worker interpreter starts and imports the preload modules (`python -c 'import torch'`;
/// `pass` when none): a broken venv fails once here, not once per rank after the rendezvous.
pub async fn interpreter(inputs: &Inputs) -> Verdict {
    let t0 = Instant::now();
    let Some(python) = &inputs.python else {
        return verdict(
            "interpreter",
            t0,
            Status::Skipped,
            "--no-python: no interpreter".into(),
        );
    };
    let code = match inputs.preload.is_empty() {
        true => "pass".to_string(),
        false => format!("import {}", inputs.preload.join(", ")),
    };
    let ran = run_bounded(python, &["-c", &code], inputs.timeout, &inputs.contain).await;
    let shown = python.display();
    let ok = match inputs.preload.is_empty() {
        true => format!("{shown} starts"),
        false => format!("{shown} starts and imports {}", inputs.preload.join(", ")),
    };
    match ran.succeeded() {
        true => verdict("interpreter", t0, Status::Ok, ok),
        false => verdict(
            "interpreter",
            t0,
            Status::Failed,
            match inputs.preload.is_empty() {
                true => format!("{shown} does not start: {}", describe(&ran, inputs.timeout)),
                false => format!(
                    "{shown} cannot import {}: {}",
                    inputs.preload.join(", "),
                    describe(&ran, inputs.timeout)
                ),
            },
        ),
    }
}

/// The site's own check, through `sh -c`.
pub async fn command(inputs: &Inputs) -> Option<Verdict> {
    let cmd = inputs.command.as_deref()?;
    let t0 = Instant::now();
    let ran = run_bounded("/bin/sh", &["-c", cmd], inputs.timeout, &inputs.contain).await;
    let (status, what) = match ran.succeeded() {
        true => (Status::Ok, "passed"),
        false => (Status::Failed, "failed"),
    };
    Some(verdict(
        "command",
        t0,
        status,
        format!("{cmd:?} {what} ({})", describe(&ran, inputs.timeout)),
    ))
}

/// The visible GPUs against `--nproc-per-node`, each answering `nvidia-smi`; skipped without
/// `nvidia-smi` on PATH.
pub async fn gpus(inputs: &Inputs) -> Verdict {
    let t0 = Instant::now();
    let Some(smi) = find_on_path("nvidia-smi", inputs.path.as_deref()) else {
        return verdict(
            "gpus",
            t0,
            Status::Skipped,
            "no nvidia-smi on PATH (no NVIDIA GPU checked)".into(),
        );
    };
    let args = ["--query-gpu=index", "--format=csv,noheader"];
    let ran = run_bounded(&smi, &args, inputs.timeout, &inputs.contain).await;
    let Ran::Exited {
        code: Some(0),
        tail,
    } = &ran
    else {
        return verdict(
            "gpus",
            t0,
            Status::Failed,
            format!("nvidia-smi: {}", describe(&ran, inputs.timeout)),
        );
    };
    let listed = tail.len().max(count_lines_hint(tail));
    let visible = match &inputs.cuda_visible {
        Some(v) if !v.trim().is_empty() => listed.min(v.split(',').count()),
        _ => listed,
    };
    let detail = format!("{visible} visible, --nproc-per-node {}", inputs.nproc);
    match visible >= inputs.nproc {
        true => verdict("gpus", t0, Status::Ok, detail),
        false => verdict("gpus", t0, Status::Failed, detail),
    }
}

/// `nvidia-smi` prints one line per GPU; the runner keeps only the last few, whose last one is
/// the highest index.
fn count_lines_hint(tail: &[String]) -> usize {
    tail.last()
        .and_then(|l| l.trim().parse::<usize>().ok())
        .map_or(0, |i| i + 1)
}

fn find_on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = path?;
    std::env::split_paths(path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The checks that only read the file system and `/proc`.
pub fn local(inputs: &Inputs) -> Vec<Verdict> {
    vec![
        log_dir(inputs),
        checkpoint_dir(inputs),
        shm(inputs, Path::new("/dev/shm")),
        memory(
            inputs,
            &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        ),
        nofile(inputs),
        nics(inputs, Path::new("/sys/class/net")),
    ]
}

/// (total, free for unprivileged users) bytes of the file system holding `path`.
fn space(path: &Path) -> Result<(u64, u64), String> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| e.to_string())?;
    let frag = st.fragment_size() as u64;
    Ok((
        st.blocks() as u64 * frag,
        st.blocks_available() as u64 * frag,
    ))
}

/// The nearest existing directory at or above `path` (the log directory is created later).
fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.is_dir())
}

pub(super) fn log_dir(inputs: &Inputs) -> Verdict {
    dir_space(
        "log-dir",
        "--log-dir",
        inputs.log_dir.as_deref(),
        inputs.thresholds.log_dir_free,
    )
}

pub(super) fn checkpoint_dir(inputs: &Inputs) -> Verdict {
    dir_space(
        "checkpoint-dir",
        "--checkpoint-dir",
        inputs.checkpoint_dir.as_deref(),
        inputs.thresholds.checkpoint_dir_free,
    )
}

/// Free space on the file system of `dir` (its nearest existing directory: it may be made
/// later) against `need`; skipped without the flag.
fn dir_space(check: &'static str, flag: &str, dir: Option<&Path>, need: u64) -> Verdict {
    let t0 = Instant::now();
    let Some(dir) = dir else {
        return verdict(check, t0, Status::Skipped, format!("no {flag}"));
    };
    let Some(at) = existing_ancestor(dir) else {
        return verdict(
            check,
            t0,
            Status::Failed,
            format!("{}: no existing directory above it", dir.display()),
        );
    };
    match space(at) {
        Err(e) => verdict(
            check,
            t0,
            Status::Failed,
            format!("{}: cannot read its free space: {e}", at.display()),
        ),
        Ok((_, free)) => {
            let detail = format!(
                "{} free in {} (need {})",
                mib(free),
                at.display(),
                mib(need)
            );
            let status = if free >= need {
                Status::Ok
            } else {
                Status::Failed
            };
            verdict(check, t0, status, detail)
        }
    }
}

pub(super) fn shm(inputs: &Inputs, path: &Path) -> Verdict {
    let t0 = Instant::now();
    match space(path) {
        Err(e) => verdict(
            "shm",
            t0,
            Status::Failed,
            format!("{}: {e}", path.display()),
        ),
        Ok((total, free)) => {
            let need = inputs.thresholds.shm_per_worker * inputs.nproc as u64;
            let detail = format!(
                "{} free of {} in {} (need {} for {} workers)",
                mib(free),
                mib(total),
                path.display(),
                mib(need),
                inputs.nproc
            );
            let status = if free >= need {
                Status::Ok
            } else {
                Status::Failed
            };
            verdict("shm", t0, status, detail)
        }
    }
}

/// `MemAvailable` of `/proc/meminfo` text against the workers.
pub(super) fn memory(inputs: &Inputs, meminfo: &str) -> Verdict {
    let t0 = Instant::now();
    let avail = meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    });
    let Some(avail) = avail else {
        return verdict(
            "memory",
            t0,
            Status::Skipped,
            "no MemAvailable in /proc/meminfo".into(),
        );
    };
    let need = inputs.thresholds.mem_per_worker * inputs.nproc as u64;
    let detail = format!(
        "{} available (need {} for {} workers)",
        mib(avail),
        mib(need),
        inputs.nproc
    );
    let status = if avail >= need {
        Status::Ok
    } else {
        Status::Failed
    };
    verdict("memory", t0, status, detail)
}

pub(super) fn nofile(inputs: &Inputs) -> Verdict {
    let t0 = Instant::now();
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Err(e) => verdict("nofile", t0, Status::Failed, format!("getrlimit: {e}")),
        Ok((soft, _)) => {
            let need = inputs.thresholds.nofile;
            let detail = format!("open-file limit {soft} (need {need})");
            let status = if soft >= need {
                Status::Ok
            } else {
                Status::Failed
            };
            verdict("nofile", t0, status, detail)
        }
    }
}

/// Each interface `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME` names is up (`operstate` up, or
/// unknown as loopback reports). NCCL's syntax: a comma list of prefixes, `=name` for an exact
/// name; a `^` list excludes and names nothing to check.
pub(super) fn nics(inputs: &Inputs, sys: &Path) -> Verdict {
    let t0 = Instant::now();
    if inputs.nics.is_empty() {
        return verdict(
            "nics",
            t0,
            Status::Skipped,
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME not set".into(),
        );
    }
    let present: Vec<(String, String)> = std::fs::read_dir(sys)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let state = std::fs::read_to_string(e.path().join("operstate"))
                        .unwrap_or_default()
                        .trim()
                        .to_string();
                    (name, state)
                })
                .collect()
        })
        .unwrap_or_default();
    let up = |s: &str| s == "up" || s == "unknown";
    let mut bad = Vec::new();
    let mut good = Vec::new();
    for (var, value) in &inputs.nics {
        if value.starts_with('^') {
            continue;
        }
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (exact, name) = match item.strip_prefix('=') {
                Some(n) => (true, n),
                None => (false, item),
            };
            let matched: Vec<&(String, String)> = present
                .iter()
                .filter(|(n, _)| {
                    if exact {
                        n == name
                    } else {
                        n.starts_with(name)
                    }
                })
                .collect();
            match matched.iter().find(|(_, s)| up(s)) {
                Some((n, _)) => good.push(n.clone()),
                None if matched.is_empty() => bad.push(format!("{var}: no interface {item}")),
                None => bad.push(format!(
                    "{var}: {item} is {}",
                    matched
                        .iter()
                        .map(|(n, s)| format!("{n} {s}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
    match bad.is_empty() {
        true if good.is_empty() => verdict(
            "nics",
            t0,
            Status::Skipped,
            "only excluded interfaces named".into(),
        ),
        true => verdict("nics", t0, Status::Ok, format!("{} up", good.join(", "))),
        false => verdict("nics", t0, Status::Failed, bad.join("; ")),
    }
}
