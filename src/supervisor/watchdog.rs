//! The watchdog: a tiny forked helper that SIGKILLs every worker process group when rdrun dies
//! without cleaning up (SIGKILL of rdrun, OOM kill, abort).
//!
//! PR_SET_PDEATHSIG already kills each worker when rdrun dies, but not the worker's own children
//! (the flag is cleared on fork, prctl(2)), which torchrun leaves running. The watchdog closes that
//! gap: each worker writes its pid (= its process group id) into a socket between fork and exec;
//! the watchdog holds the other end, and when every writer is closed — rdrun is gone — it kills
//! each registered group. rdrun disarms it (writes 0) once it has stopped the groups itself.
//! rdrun may also register its private temporary log directory (one that holds nothing the user
//! needs once rdrun is gone): the watchdog then removes it too, by exec'ing `rm -rf`.
//!
//! Messages are a native-endian i32 header: > 0 a process group id; 0 forget every group; -1
//! forget the directory; <= -2 a directory path of `-header - 1` bytes follows.
//!
//! A unix stream socket pair rather than a pipe: writers use `send(MSG_NOSIGNAL)`, so a dead
//! watchdog costs an EPIPE, never a SIGPIPE that would kill a worker before its exec.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most process groups the watchdog remembers between two disarms.
const CAPACITY: usize = 4096;
/// Longest directory path the watchdog accepts (PATH_MAX without the NUL).
const PATH_CAP: usize = 4095;

/// Handle to the watchdog process, held by rdrun for its whole life.
#[derive(Debug)]
pub struct Watchdog {
    write: OwnedFd,
    pid: i32,
}

impl Watchdog {
    /// Forks the watchdog. Call before any thread or runtime exists, so that the child is a
    /// plain single-threaded copy; it runs only async-signal-safe code on preallocated memory.
    pub fn start() -> io::Result<Watchdog> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: valid out-array of two ints; SOCK_CLOEXEC keeps the write end out of workers
        // (they write through it between fork and exec only).
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair just returned these two fresh descriptors; we own them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Preallocated before fork: the child must not allocate.
        let mut table = vec![0 as libc::pid_t; CAPACITY];
        // SAFETY: fork(2); the child branch below only uses async-signal-safe calls.
        let pid = unsafe { libc::fork() };
        if pid == -1 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: in the child; see `child_main`.
            unsafe { child_main(read.as_raw_fd(), write.as_raw_fd(), &mut table) }
        }
        drop(read);
        tracing::debug!(pid, "watchdog started");
        Ok(Watchdog { write, pid })
    }

    /// The write end workers register into (see `worker::SpawnSpec::watchdog_fd`).
    pub fn fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// The watchdog's pid (a child of rdrun, not part of any worker group).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Forgets every registered group: rdrun has stopped them itself.
    pub fn disarm(&self) {
        register(self.fd(), 0);
    }

    /// Registers the directory to remove if rdrun dies without cleaning up (replaces any
    /// earlier one). Paths longer than PATH_MAX are not registered.
    pub fn set_dir(&self, dir: &std::path::Path) {
        use std::os::unix::ffi::OsStrExt;
        let bytes = dir.as_os_str().as_bytes();
        if bytes.is_empty() || bytes.len() > PATH_CAP || bytes.contains(&0) {
            return;
        }
        let header = -(bytes.len() as i32) - 1;
        let mut msg = header.to_ne_bytes().to_vec();
        msg.extend_from_slice(bytes);
        let mut sent = 0;
        while sent < msg.len() {
            // SAFETY: send(2) from a valid buffer slice.
            let n = unsafe {
                libc::send(
                    self.fd(),
                    msg[sent..].as_ptr().cast(),
                    msg.len() - sent,
                    libc::MSG_NOSIGNAL,
                )
            };
            if n <= 0 {
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            sent += n as usize;
        }
    }

    /// Forgets the registered directory (rdrun removed or kept it itself).
    pub fn forget_dir(&self) {
        register(self.fd(), -1);
    }
}

/// Sends one 4-byte message (a process group id, 0 = forget groups, -1 = forget the directory).
///
/// Async-signal-safe: called between fork and exec. Errors are ignored (a watchdog that died
/// cannot be helped; MSG_NOSIGNAL keeps that from killing the caller). A 4-byte message on a
/// unix stream socket is never split (unix(7)).
pub fn register(fd: RawFd, pgid: libc::pid_t) {
    // SAFETY: send(2) of 4 bytes from a valid local.
    let _ = unsafe {
        libc::send(
            fd,
            (&pgid as *const libc::pid_t).cast(),
            4,
            libc::MSG_NOSIGNAL,
        )
    };
}

/// The watchdog's whole life. Never returns.
///
/// # Safety
/// Must only run in a freshly forked child; uses only async-signal-safe calls.
unsafe fn child_main(read: RawFd, write: RawFd, table: &mut [libc::pid_t]) -> ! {
    // Terminal and job-control signals go to rdrun's whole process group; the watchdog must
    // outlive them (SIGUSR1/2 would otherwise kill it by default action).
    for sig in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
        libc::SIGTSTP,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    libc::close(write);
    // Do not hold rdrun's stdout/stderr open: whoever reads them waits for EOF.
    let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
    if null >= 0 {
        libc::dup2(null, 0);
        libc::dup2(null, 1);
        libc::dup2(null, 2);
    }
    let read = if read == 3 || libc::dup2(read, 3) == 3 {
        3
    } else {
        read
    };
    // Drop every other inherited descriptor (write ends of other pipes rdrun's parent gave it).
    libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
    let mut len = 0usize;
    let mut buf = [0u8; 4096];
    let mut carry = [0u8; 4];
    let mut carried = 0usize;
    // Directory to remove: bytes, length, bytes of it still to come, and whether it is usable.
    let mut path = [0u8; PATH_CAP + 1];
    let mut path_len = 0usize;
    let mut path_left = 0usize;
    let mut path_ok = false;
    loop {
        let n = libc::read(read, buf.as_mut_ptr().cast(), buf.len());
        if n < 0 {
            if *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        for &byte in &buf[..n as usize] {
            if path_left > 0 {
                path[path_len] = byte;
                path_len += 1;
                path_left -= 1;
                if path_left == 0 {
                    path[path_len] = 0;
                    path_ok = true;
                }
                continue;
            }
            carry[carried] = byte;
            carried += 1;
            if carried < 4 {
                continue;
            }
            carried = 0;
            let value = i32::from_ne_bytes(carry);
            if value > 0 {
                if len < table.len() && !table[..len].contains(&value) {
                    table[len] = value;
                    len += 1;
                }
            } else if value == 0 {
                len = 0;
            } else if value == -1 {
                path_ok = false;
            } else {
                // The sender never exceeds PATH_CAP; clamp anyway so a bad length cannot
                // overrun the buffer (the path is then unusable and dropped).
                let want = (-(value as i64) - 1) as usize;
                path_ok = false;
                path_len = 0;
                path_left = want.min(PATH_CAP);
            }
        }
    }
    for &pgid in &table[..len] {
        libc::kill(-pgid, libc::SIGKILL);
    }
    if path_ok && path_len > 0 {
        // exec keeps this async-signal-safe: no allocation, a stack argv of static strings.
        let argv: [*const libc::c_char; 5] = [
            c"rm".as_ptr(),
            c"-rf".as_ptr(),
            c"--".as_ptr(),
            path.as_ptr().cast(),
            std::ptr::null(),
        ];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        for rm in [c"/bin/rm", c"/usr/bin/rm"] {
            libc::execve(rm.as_ptr(), argv.as_ptr(), envp.as_ptr());
        }
    }
    libc::_exit(0)
}
