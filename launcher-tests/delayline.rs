//! A delay line on one namespace host's link, for kernels without `tc netem` (issue 28 item 3:
//! the network pre-check's latency rule). The kernel these tests were written on has no qdisc
//! that delays (no `netem`; no `fq` or `etf` either, which a `tc` BPF program setting
//! `skb->tstamp` would need: only `htb`, `tbf`, `pfifo`/`bfifo` and `clsact`), so the delay is
//! made in user space, as network emulators do: the host's `veth` is replaced by a pair of TAP
//! devices — `eth0` in the host's namespace, `v<i>` on the hub's bridge — and this test process
//! copies every frame between them, holding each frame the host sends for the delay before it
//! reaches the bridge (its replies then arrive that much later: its round trips grow by it).
//! Frames stay in order. A TAP device without `TUNSETOFFLOAD` hands whole, checksummed frames of
//! at most the MTU to user space, so what is copied is what a wire carries.
//!
//! The devices live as long as their file descriptors: [`DelayLine`]'s drop stops the copying
//! threads (each polls with a short timeout and checks a flag) and closes them.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns::Netns;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const POLL_MS: i32 = 50;

/// `struct ifreq` as TUNSETIFF reads it: the name and the flags (the rest of the union unused).
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens (creates) TAP device `name` in namespace `ns` (`/var/run/netns/<ns>`), from a thread of
/// its own: `setns` changes only the calling thread's namespace, and that thread then ends.
fn open_tap(ns: &str, name: &str) -> OwnedFd {
    let ns_path = format!("/var/run/netns/{ns}");
    let name = name.to_string();
    std::thread::spawn(move || {
        let nsf = File::open(&ns_path).unwrap_or_else(|e| panic!("{ns_path}: {e}"));
        nix::sched::setns(&nsf, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {ns_path}: {e}"));
        let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        assert!(
            fd >= 0,
            "open /dev/net/tun: {}",
            std::io::Error::last_os_error()
        );
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) };
        assert!(
            rc == 0,
            "TUNSETIFF {name} in {ns_path}: {}",
            std::io::Error::last_os_error()
        );
        fd
    })
    .join()
    .expect("the TAP thread")
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

/// Waits up to [`POLL_MS`] for a frame on `fd`; reads it (`None`: none came, or an error).
fn read_frame(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    if unsafe { libc::poll(&mut p, 1, POLL_MS) } <= 0 {
        return None;
    }
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    (n > 0).then_some(n as usize)
}

fn write_frame(fd: &OwnedFd, frame: &[u8]) {
    // A frame the device refuses (it is going down) is dropped, as a wire would.
    unsafe { libc::write(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
}

/// One host's link replaced by a delay line (see the module doc); removed on drop.
pub(crate) struct DelayLine {
    /// The delay in microseconds, read for each frame.
    delay_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayLine {
    /// Whether TAP devices can be made here (`None`), else why not.
    pub(crate) fn unavailable() -> Option<String> {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
        {
            Ok(_) => None,
            Err(e) => Some(format!("no TAP devices here: /dev/net/tun: {e}")),
        }
    }

    /// Replaces host `i`'s veth with the TAP pair, every frame it sends held for the delay
    /// ([`DelayLine::set`]; zero at first: a link through the same copying path, to compare
    /// with). Its addresses are as before.
    pub(crate) fn install(net: &Netns, i: usize) -> DelayLine {
        let node = net.name(i);
        let hub = net.hub();
        let v = format!("v{i}");
        // Deleting one end of the veth deletes both.
        ip(&["-n", &hub, "link", "del", &v]);
        let host_tap = Arc::new(open_tap(&node, "eth0"));
        let hub_tap = Arc::new(open_tap(&hub, &v));
        ip(&[
            "-n",
            &node,
            "addr",
            "add",
            &format!("{}/24", net.addr(i)),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &node,
            "addr",
            "add",
            &format!("{}/64", net.addr6(i)),
            "dev",
            "eth0",
            "nodad",
        ]);
        ip(&["-n", &node, "link", "set", "eth0", "up"]);
        ip(&["-n", &hub, "link", "set", &v, "master", "br0"]);
        ip(&["-n", &hub, "link", "set", &v, "up"]);
        let stop = Arc::new(AtomicBool::new(false));
        let delay_us = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        // Host to bridge, delayed: a reader stamps each frame, a writer sends it when due.
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
        {
            let (stop, from, us) = (stop.clone(), host_tap.clone(), delay_us.clone());
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Some(n) = read_frame(&from, &mut buf) {
                        let delay = Duration::from_micros(us.load(Ordering::Relaxed));
                        let _ = tx.send((Instant::now() + delay, buf[..n].to_vec()));
                    }
                }
            }));
        }
        {
            let (stop, to) = (stop.clone(), hub_tap.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((due, frame)) = rx.recv_timeout(Duration::from_millis(POLL_MS as u64))
                    else {
                        continue;
                    };
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    write_frame(&to, &frame);
                }
            }));
        }
        // Bridge to host, at once.
        {
            let (stop, from, to) = (stop.clone(), hub_tap, host_tap);
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Some(n) = read_frame(&from, &mut buf) {
                        write_frame(&to, &buf[..n]);
                    }
                }
            }));
        }
        DelayLine {
            delay_us,
            stop,
            threads,
        }
    }

    /// Every frame the host sends from now on is held `delay`.
    pub(crate) fn set(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Each thread wakes within POLL_MS; the last one holding a device's fd closes it.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
