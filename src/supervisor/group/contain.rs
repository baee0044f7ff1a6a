//! Process containment: one cgroup per run that holds every worker and everything they start,
//! so that the run can be killed as a whole whatever sessions and process groups its processes
//! made (`setsid`, double fork, daemons).
//!
//! rdrun creates `rdrun-<pid>-<random>` below its own cgroup, in the cgroup v2 hierarchy (killed
//! with one write to `cgroup.kill`, Linux ≥ 5.14, or by freeze / SIGKILL every member / thaw with
//! `cgroup.freeze`) or else in the v1 `freezer` hierarchy (`freezer.state`). Each worker moves
//! itself in between fork and exec ([`join`]: `0` into `cgroup.procs`), so nothing it ever
//! starts is outside. The kill paths work from the directory alone ([`kill_and_remove`]), so the
//! watchdog, which outlives rdrun, can use them with nothing but the path.
//!
//! Where rdrun may not create a cgroup (unprivileged without delegation, a read-only cgroupfs)
//! or `RDRUN_CGROUP=off`, there is no cgroup and the watchdog falls back to tracking rdrun's
//! process tree (see `watchdog`); `docs/compat.md` states what each case guarantees.
//! `RDRUN_CGROUP=v2` / `v1` pick one hierarchy (tests, debugging); the default `auto` tries v2,
//! then v1.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The containment choice and its variable are resolved in the config (`RDRUN_CGROUP`).
pub use crate::config::runenv::{CgroupMode as Mode, CGROUP_ENV as ENV};

/// One line of `/proc/self/mountinfo` as containment needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount's root inside its filesystem (for cgroupfs: the cgroup shown at `point`).
    pub root: String,
    pub point: PathBuf,
    pub fstype: String,
    pub super_opts: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, proc(5)).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Parses `/proc/self/mountinfo` (proc(5)): `id parent dev root point opts [tags…] - fstype
/// source superopts`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        out.push(Mount {
            root: String::from_utf8_lossy(&unescape(l[3])).into_owned(),
            point: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(l[4]))),
            fstype: r[0].to_string(),
            super_opts: r[2].to_string(),
        });
    }
    out
}

/// One line of `/proc/self/cgroup`: `id:controllers:path` (v2: `0::path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub controllers: String,
    pub path: String,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?.to_string();
            let path = parts.next()?.to_string();
            Some(Membership { controllers, path })
        })
        .collect()
}

/// `point` + the part of `path` below the mount's `root`; `None` when this mount does not show
/// the cgroup (a bind mount of another subtree).
fn below(mount: &Mount, path: &str) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    Some(mount.point.join(rest.trim_start_matches('/')))
}

/// The directories (in order of preference) below which the run's cgroup may be created: the
/// caller's own cgroup in the v2 hierarchy, then in the v1 freezer hierarchy.
pub fn candidate_parents(mode: Mode, mounts: &[Mount], cgroups: &[Membership]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if matches!(mode, Mode::Auto | Mode::V2) {
        if let Some(own) = cgroups.iter().find(|m| m.controllers.is_empty()) {
            if let Some(dir) = mounts
                .iter()
                .filter(|m| m.fstype == "cgroup2")
                .find_map(|m| below(m, &own.path))
            {
                out.push(dir);
            }
        }
    }
    if matches!(mode, Mode::Auto | Mode::V1) {
        let freezer = |opts: &str| opts.split(',').any(|o| o == "freezer");
        if let Some(own) = cgroups.iter().find(|m| freezer(&m.controllers)) {
            if let Some(dir) = mounts
                .iter()
                .filter(|m| m.fstype == "cgroup" && freezer(&m.super_opts))
                .find_map(|m| below(m, &own.path))
            {
                out.push(dir);
            }
        }
    }
    out
}

/// [`candidate_parents`] of the calling process.
pub fn parents(mode: Mode) -> Vec<PathBuf> {
    if mode == Mode::Off {
        return Vec::new();
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    candidate_parents(
        mode,
        &parse_mountinfo(&mounts),
        &parse_proc_cgroup(&cgroups),
    )
}

/// The run's cgroup directories that may exist: one per candidate parent, all with the same
/// name (`rdrun-<pid>-<random>`). Computed before the watchdog is forked, so that it knows what
/// to remove even if rdrun dies while creating it.
pub fn plan(mode: Mode) -> Vec<PathBuf> {
    let name = format!("rdrun-{}-{:08x}", std::process::id(), random_u32());
    parents(mode)
        .into_iter()
        .map(|parent| parent.join(&name))
        .collect()
}

/// A random suffix for the run's cgroup name (unique among concurrent runs of one user).
fn random_u32() -> u32 {
    fastrand::u32(..)
}

/// The run's cgroup: its directory and `cgroup.procs` open for writing (workers write `0` there
/// between fork and exec, see [`join`]).
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    procs: OwnedFd,
}

impl Cgroup {
    /// Creates the first of `dirs` that works: created, of a kind rdrun can kill, and one that a
    /// forked probe process can actually join (the v2 "no internal processes" rule or the
    /// delegation rules may forbid it even where mkdir succeeds). Single-threaded callers only
    /// (it forks the probe). The error lists why each candidate failed.
    pub fn create(dirs: &[PathBuf]) -> Result<Cgroup, String> {
        let mut why = Vec::new();
        for dir in dirs {
            match Self::try_create(dir) {
                Ok(cg) => return Ok(cg),
                Err(err) => why.push(format!("{}: {err}", dir.display())),
            }
        }
        if why.is_empty() {
            why.push("no cgroup v2 or v1 freezer hierarchy mounted".to_string());
        }
        Err(why.join("; "))
    }

    fn try_create(dir: &Path) -> io::Result<Cgroup> {
        std::fs::create_dir(dir)?;
        let made = Self::open_checked(dir);
        if made.is_err() {
            let _ = std::fs::remove_dir(dir);
        }
        made
    }

    fn open_checked(dir: &Path) -> io::Result<Cgroup> {
        if kind(dir).is_none() {
            return Err(io::Error::other(
                "neither cgroup.kill, cgroup.freeze nor freezer.state is available",
            ));
        }
        let procs = open_procs(dir)?;
        probe(procs.as_raw_fd())?;
        Ok(Cgroup {
            dir: dir.to_path_buf(),
            procs,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`, for [`join`] in a forked child.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// SIGKILLs everything inside (sub-cgroups included) without waiting.
    pub fn kill(&self) {
        kill(&self.dir, Duration::from_millis(500));
    }

    /// Live processes inside (sub-cgroups included).
    pub fn members(&self) -> Vec<i32> {
        members(&self.dir)
    }

    /// Kills everything inside, waits up to `timeout` for it to be empty and removes it; false
    /// (and the directory stays) when something outlived the wait.
    pub fn destroy(self, timeout: Duration) -> bool {
        kill_and_remove(&self.dir, timeout)
    }
}

/// `cgroup.procs` of `dir`, open for writing (close-on-exec: a child writes it before exec).
fn open_procs(dir: &Path) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
        .map_err(io::Error::other)?;
    // SAFETY: open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open just returned this descriptor; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A cgroup made below the run's for one program that is not a worker (a health check, issue
/// 38.11): killed and removed on its own when the program ends; a kill of the run's cgroup
/// (the stop, the watchdog) takes it too, as every sub-cgroup.
#[derive(Debug)]
pub struct SubCgroup {
    dir: PathBuf,
    procs: OwnedFd,
}

impl SubCgroup {
    /// Creates `run/name`; the error says why (the caller then runs the program without one).
    pub fn create(run: &Path, name: &str) -> io::Result<SubCgroup> {
        let dir = run.join(name);
        std::fs::create_dir(&dir)?;
        match open_procs(&dir) {
            Ok(procs) => Ok(SubCgroup { dir, procs }),
            Err(err) => {
                let _ = std::fs::remove_dir(&dir);
                Err(err)
            }
        }
    }

    /// `cgroup.procs`, for [`join`] in a forked child.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Kills everything inside, waits up to `timeout` for it to empty and removes it; false
    /// (and the directory stays, for the run's end to remove) when something outlived the wait.
    pub fn destroy(self, timeout: Duration) -> bool {
        drop(self.procs);
        kill_and_remove(&self.dir, timeout)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// How a cgroup directory can be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// v2 `cgroup.kill` (5.14+): the kernel kills the subtree, forks in flight included.
    V2Kill,
    /// v2 `cgroup.freeze` (5.2+).
    V2Freeze,
    /// v1 freezer `freezer.state`.
    V1Freezer,
}

fn kind(dir: &Path) -> Option<Kind> {
    if dir.join("cgroup.kill").exists() {
        Some(Kind::V2Kill)
    } else if dir.join("cgroup.freeze").exists() {
        Some(Kind::V2Freeze)
    } else if dir.join("freezer.state").exists() {
        Some(Kind::V1Freezer)
    } else {
        None
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs_fd` (`0` means "the
/// writer", cgroups(7)). Async-signal-safe: called between fork and exec.
pub fn join(procs_fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: write(2) of one byte from a static buffer.
        let n = unsafe { libc::write(procs_fd, b"0".as_ptr().cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Forks a process that joins the cgroup and exits: proves that workers will be able to.
fn probe(procs_fd: RawFd) -> io::Result<()> {
    // SAFETY: fork(2) in a single-threaded process (see `Cgroup::create`); the child only
    // calls write(2) and _exit(2).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = match join(procs_fd) {
            Ok(()) => 0,
            Err(err) => err.raw_os_error().unwrap_or(libc::EIO).clamp(1, 255),
        };
        // SAFETY: ends the forked child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    let mut status = 0;
    loop {
        // SAFETY: waitpid(2) on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::last_os_error());
        }
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(io::Error::from_raw_os_error(errno)),
        _ => Err(io::Error::other("the probe process was killed")),
    }
}

/// `dir` and every cgroup below it, deepest first (a nested rdrun makes its own inside ours).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.filter_map(Result::ok) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(d);
    }
    out.reverse();
    out
}

/// Live members of `dir` and its sub-cgroups (zombies are not listed by the kernel).
pub fn members(dir: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    for d in tree(dir) {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Whether the v2 cgroup still has a live process (`populated 1` in `cgroup.events`); for v1,
/// whether any member is listed.
fn populated(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(text) => text.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => !members(dir).is_empty(),
    }
}

/// SIGKILLs every process in `dir` and below. With `cgroup.kill` one write does it; otherwise
/// freeze (so nothing forks while the members are listed), SIGKILL each, thaw — repeated until
/// a frozen listing is empty or `budget` is spent.
pub fn kill(dir: &Path, budget: Duration) {
    let Some(kind) = kind(dir) else {
        return;
    };
    if kind == Kind::V2Kill {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        return;
    }
    let (file, freeze, thaw) = match kind {
        Kind::V2Freeze => ("cgroup.freeze", "1", "0"),
        _ => ("freezer.state", "FROZEN", "THAWED"),
    };
    let deadline = Instant::now() + budget;
    loop {
        let _ = std::fs::write(dir.join(file), freeze);
        // Freezing completes asynchronously; a listing while it settles may miss a fork, which
        // the next round catches.
        wait_frozen(dir, kind, deadline);
        let pids = members(dir);
        for &pid in &pids {
            // SAFETY: kill(2) of a process listed in the run's own cgroup.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        let _ = std::fs::write(dir.join(file), thaw);
        if pids.is_empty() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_frozen(dir: &Path, kind: Kind, deadline: Instant) {
    while Instant::now() < deadline {
        let frozen = match kind {
            Kind::V2Freeze => std::fs::read_to_string(dir.join("cgroup.events"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1")),
            _ => std::fs::read_to_string(dir.join("freezer.state"))
                .is_ok_and(|t| t.trim() == "FROZEN"),
        };
        if frozen {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Kills everything in `dir`, waits up to `timeout` for it to empty, then removes it and the
/// cgroups below it. True when `dir` is gone (or never existed).
pub fn kill_and_remove(dir: &Path, timeout: Duration) -> bool {
    if !dir.exists() {
        return true;
    }
    let deadline = Instant::now() + timeout;
    kill(dir, timeout);
    let mut nap = Duration::from_millis(1);
    while populated(dir) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
        // A v1 member that was mid-fork when listed, or a nested cgroup's late arrival.
        if !matches!(kind(dir), Some(Kind::V2Kill)) {
            kill(dir, Duration::from_millis(100));
        }
    }
    for d in tree(dir) {
        let _ = std::fs::remove_dir(&d);
    }
    !dir.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mountinfo_and_proc_cgroup() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(m.len(), 4);
        assert_eq!(m[3].fstype, "cgroup2");
        assert_eq!(m[3].point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert_eq!(m[1].super_opts, "rw,freezer");
        let esc = parse_mountinfo("1 2 0:1 / /a\\040b rw - cgroup2 cgroup2 rw\n");
        assert_eq!(esc[0].point, PathBuf::from("/a b"));
        let c = parse_proc_cgroup("6:freezer:/f\n4:memory:/m\n0::/user.slice/x.scope\n");
        assert_eq!(
            c[2],
            Membership {
                controllers: String::new(),
                path: "/user.slice/x.scope".into()
            }
        );
    }

    #[test]
    fn candidates_per_mode() {
        let m = parse_mountinfo(HYBRID);
        let c = parse_proc_cgroup("6:freezer:/jobs\n0::/a/b\n");
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            candidate_parents(Mode::Auto, &m, &c),
            vec![
                p("/sys/fs/cgroup/unified/a/b"),
                p("/sys/fs/cgroup/freezer/jobs")
            ]
        );
        assert_eq!(
            candidate_parents(Mode::V1, &m, &c),
            vec![p("/sys/fs/cgroup/freezer/jobs")]
        );
        assert_eq!(
            candidate_parents(Mode::V2, &m, &c),
            vec![p("/sys/fs/cgroup/unified/a/b")]
        );
        assert!(candidate_parents(Mode::Off, &m, &c).is_empty());
        // A container's cgroupfs showing only its own subtree (mount root /docker/x).
        let m = parse_mountinfo("1 2 0:1 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let c = parse_proc_cgroup("0::/docker/x/init\n");
        assert_eq!(
            candidate_parents(Mode::Auto, &m, &c),
            vec![p("/sys/fs/cgroup/init")]
        );
        // A cgroup outside what is mounted: no candidate.
        let c = parse_proc_cgroup("0::/other\n");
        assert!(candidate_parents(Mode::Auto, &m, &c).is_empty());
        let c = parse_proc_cgroup("0::/docker/xy\n");
        assert!(candidate_parents(Mode::Auto, &m, &c).is_empty());
    }
}
