//! Machine facts resolution needs, behind the [`Host`] trait so that every decision is testable:
//! CPUs in the affinity mask, NVIDIA GPUs (procfs, else `nvidia-smi -L`, bounded), what is at a
//! path, randomness for run ids; sysfs/procfs text for the CPU topology of `--numa-binding` and
//! `--cpu-binding` (`numa.rs`); and the GPU count a CUDA program would see.

use std::path::Path;
use std::time::Duration;

use crate::cli::EnvFn;

/// What [`Host::file`] found at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Missing,
    Dir,
    File { executable: bool },
}

/// The machine facts resolution needs; [`RealHost`] in production, a fake in tests.
pub trait Host {
    /// CPUs in this process's affinity mask (torchrun: `os.sched_getaffinity`).
    fn cpu_count(&self) -> usize;
    /// NVIDIA GPUs the driver lists; `None` when there is no NVIDIA driver.
    fn nvidia_gpu_count(&self) -> Option<usize>;
    /// What is at `path` (relative paths against the current directory).
    fn file(&self, path: &Path) -> FileKind;
    /// 16 random bytes for a run id.
    fn random_bytes(&self) -> [u8; 16];
    /// How many processes this user may have (the soft RLIMIT_NPROC); `None` when unbounded
    /// (unlimited, or root, whom the kernel does not hold to it).
    fn process_limit(&self) -> Option<u64>;
    /// The text of a sysfs/procfs file (`/sys/...`, `/proc/driver/...`); `None` when unreadable.
    /// The default (fake machines of tests that do not care) has no such files.
    fn read_text(&self, _path: &Path) -> Option<String> {
        None
    }
    /// The entry names of a sysfs directory; `None` when it does not exist.
    fn list_dir(&self, _path: &Path) -> Option<Vec<String>> {
        None
    }
    /// The CPUs of this process's affinity mask, sorted (torch: `os.sched_getaffinity(0)`).
    fn allowed_cpus(&self) -> Vec<usize> {
        (0..self.cpu_count()).collect()
    }
}

/// Test hook of [`RealHost`]: a directory that stands for `/` when reading sysfs and procfs
/// topology files, so that launch tests can give real workers a fake NUMA topology. Not a user
/// setting (docs/compat.md does not list it).
pub const SYSFS_ROOT_VAR: &str = "RDRUN_TEST_SYSFS_ROOT";

/// `path` (absolute) read below `root`.
pub(crate) fn read_text_under(root: &Path, path: &Path) -> Option<String> {
    std::fs::read_to_string(root.join(path.strip_prefix("/").unwrap_or(path))).ok()
}

/// The entry names of directory `path` (absolute) below `root`.
pub(crate) fn list_dir_under(root: &Path, path: &Path) -> Option<Vec<String>> {
    let dir = std::fs::read_dir(root.join(path.strip_prefix("/").unwrap_or(path))).ok()?;
    Some(
        dir.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
    )
}

fn sys_root() -> std::path::PathBuf {
    std::env::var_os(SYSFS_ROOT_VAR)
        .filter(|v| !v.is_empty())
        .map_or_else(|| "/".into(), Into::into)
}

/// The real machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl Host for RealHost {
    fn cpu_count(&self) -> usize {
        use nix::sched::{sched_getaffinity, CpuSet};
        use nix::unistd::Pid;
        match sched_getaffinity(Pid::from_raw(0)) {
            Ok(set) => (0..CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count()
                .max(1),
            Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    fn nvidia_gpu_count(&self) -> Option<usize> {
        // The driver lists one directory per GPU here (nvidia kernel module's procfs).
        if let Ok(entries) = std::fs::read_dir("/proc/driver/nvidia/gpus") {
            return Some(entries.filter(Result::is_ok).count());
        }
        nvidia_smi_count()
    }

    fn file(&self, path: &Path) -> FileKind {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(path) {
            Err(_) => FileKind::Missing,
            Ok(m) if m.is_dir() => FileKind::Dir,
            Ok(m) => FileKind::File {
                executable: m.permissions().mode() & 0o111 != 0,
            },
        }
    }

    fn process_limit(&self) -> Option<u64> {
        use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return None;
        }
        match getrlimit(Resource::RLIMIT_NPROC) {
            Ok((soft, _)) if soft != RLIM_INFINITY => Some(soft),
            _ => None,
        }
    }

    fn read_text(&self, path: &Path) -> Option<String> {
        read_text_under(&sys_root(), path)
    }

    fn list_dir(&self, path: &Path) -> Option<Vec<String>> {
        list_dir_under(&sys_root(), path)
    }

    fn allowed_cpus(&self) -> Vec<usize> {
        use nix::sched::{sched_getaffinity, CpuSet};
        use nix::unistd::Pid;
        match sched_getaffinity(Pid::from_raw(0)) {
            Ok(set) => (0..CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .collect(),
            Err(_) => (0..self.cpu_count()).collect(),
        }
    }

    fn random_bytes(&self) -> [u8; 16] {
        let mut buf = [0u8; 16];
        if getrandom::fill(&mut buf).is_err() {
            // No OS randomness at all (it never fails on Linux ≥ 3.17): fastrand's per-process
            // seed still makes two agents' run ids differ.
            buf = fastrand::u128(..).to_le_bytes();
        }
        buf
    }
}

/// `nvidia-smi -L` line count, with a bound so that a wedged driver cannot hang rdrun.
fn nvidia_smi_count() -> Option<usize> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new("nvidia-smi")
        .arg("-L")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                child.stdout.take()?.read_to_string(&mut out).ok()?;
                if !status.success() {
                    return None;
                }
                return Some(out.lines().filter(|l| l.starts_with("GPU ")).count());
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!("nvidia-smi -L did not answer within 10 s; assuming no GPUs");
                return None;
            }
        }
    }
}

/// GPUs a CUDA program would see: CUDA_VISIBLE_DEVICES if set (entries up to the first invalid
/// one, as the CUDA runtime reads it), capped by what the driver lists; else the driver's count.
pub(super) fn gpu_count(env: EnvFn<'_>, host: &dyn Host) -> Result<usize, String> {
    let driver = host.nvidia_gpu_count();
    if let Some(cvd) = env("CUDA_VISIBLE_DEVICES") {
        let listed = visible_device_entries(&cvd);
        let n = driver.map_or(listed, |d| listed.min(d));
        if n == 0 {
            return Err(format!("no GPU is visible (CUDA_VISIBLE_DEVICES={cvd:?})"));
        }
        return Ok(n);
    }
    match driver {
        Some(n) if n > 0 => Ok(n),
        _ => Err(
            "no NVIDIA GPU found (no /proc/driver/nvidia/gpus entries, nvidia-smi -L lists none)"
                .into(),
        ),
    }
}

/// Number of usable entries in a CUDA_VISIBLE_DEVICES list: the CUDA runtime stops at the first
/// entry that is not a device index or a `GPU-`/`MIG-` UUID (e.g. `-1` hides every device).
fn visible_device_entries(list: &str) -> usize {
    list.split(',')
        .map(str::trim)
        .take_while(|e| {
            (!e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
                || e.starts_with("GPU-")
                || e.starts_with("MIG-")
        })
        .count()
}

/// getaddrinfo(3) with AI_CANONNAME: the canonical name of `host`, if the resolver knows one.
/// Blocking: callers bound it (the failure report's FQDN, a pod's own name).
pub fn canonical_name(host: &str) -> Option<String> {
    let c_host = std::ffi::CString::new(host).ok()?;
    // SAFETY: `hints` is plain data, zero is a valid value for every field.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_flags = libc::AI_CANONNAME;
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: valid C string, hints and out-pointer; the result is freed below.
    let rc = unsafe { libc::getaddrinfo(c_host.as_ptr(), std::ptr::null(), &hints, &mut res) };
    if rc != 0 || res.is_null() {
        return None;
    }
    // SAFETY: `res` is a valid list from getaddrinfo; ai_canonname is NUL-terminated or null.
    let name = unsafe {
        let canon = (*res).ai_canonname;
        let name = (!canon.is_null()).then(|| {
            std::ffi::CStr::from_ptr(canon)
                .to_string_lossy()
                .into_owned()
        });
        libc::freeaddrinfo(res);
        name
    };
    name.filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_host_counts_cpus() {
        assert!(RealHost.cpu_count() >= 1);
        assert_eq!(
            RealHost.file(Path::new("/definitely/missing")),
            FileKind::Missing
        );
        assert_eq!(RealHost.file(Path::new("/")), FileKind::Dir);
    }
}
