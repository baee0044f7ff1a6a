//! OS signals sent to rdrun: which ones are caught, what each one means for the worker group,
//! the stream of caught signals the agent selects on, and whether a shutdown signal has arrived
//! at all ([`shutdown_seen`], for code on the agent's thread that cannot read the stream).
//!
//! Handlers are installed by [`Signals::install`] as the first thing `supervisor::run` does, before
//! any worker exists (torchrun installs its handlers only just before the first spawn, spec
//! torchrun-compat §3.6); until then the binary keeps the default list blocked from its first
//! instruction ([`block_at_startup`]), so that none of them can kill rdrun by its default action. Classification is pure ([`action`]); the agent decides what to do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// A shutdown signal reached rdrun ([`shutdown_seen`]).
static SHUTDOWN_SEEN: AtomicBool = AtomicBool::new(false);

/// Whether a shutdown signal has reached rdrun, whether or not the agent has read it yet: set
/// from the signal handler itself, for code that runs on the agent's thread while its loop
/// cannot read the stream (the warm-start template's import), so that what a shutdown causes
/// there is not reported as a failure.
pub fn shutdown_seen() -> bool {
    SHUTDOWN_SEEN.load(Ordering::SeqCst)
}

/// [`shutdown_seen`], waiting up to `settle` for it: a signal sent to a whole job step
/// (`scancel`) or process group (Ctrl-C) reaches rdrun and its children in no set order, so a
/// child may die of it before rdrun's handler ran.
pub fn shutdown_seen_within(settle: Duration) -> bool {
    let until = Instant::now() + settle;
    while !shutdown_seen() {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// What a caught signal asks the agent to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// Forward the signal to every worker group, wait the grace, SIGKILL the rest, exit 128+N.
    Shutdown,
    /// Forward the signal to every worker group and keep supervising (SIGUSR1/SIGUSR2: Slurm's
    /// preemption notice and similar application-level requests).
    Forward,
}

/// The meaning of signal `sig` when it is in the handled list.
pub fn action(sig: i32) -> SignalAction {
    if sig == libc::SIGUSR1 || sig == libc::SIGUSR2 {
        SignalAction::Forward
    } else {
        // torchrun treats every handled signal as a death signal (spec §3.6); so does rdrun for
        // all but the two user signals.
        SignalAction::Shutdown
    }
}

/// True when `sig`, received while a shutdown is already in its grace period, means "kill
/// everything now" (a second Ctrl-C or a second SIGTERM).
pub fn escalates(sig: i32) -> bool {
    sig == libc::SIGINT || sig == libc::SIGTERM
}

/// What the agent does with a caught signal, given where the current stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalReaction {
    /// Send the signal to every worker group and carry on.
    Forward,
    /// Send the signal to every worker group and start the shutdown (grace, then SIGKILL).
    Shutdown,
    /// SIGKILL everything now (a second Ctrl-C or SIGTERM during the grace).
    KillNow,
}

/// The agent's reaction to `sig`. `interrupted`: a shutdown signal already arrived;
/// `in_grace`: a stop is waiting out its grace period (not yet at SIGKILL).
pub fn react(sig: i32, interrupted: bool, in_grace: bool) -> SignalReaction {
    match action(sig) {
        SignalAction::Forward => SignalReaction::Forward,
        SignalAction::Shutdown if !interrupted => SignalReaction::Shutdown,
        SignalAction::Shutdown if escalates(sig) && in_grace => SignalReaction::KillNow,
        // A repeated HUP/QUIT, or anything once SIGKILL went out: pass it on, nothing more.
        SignalAction::Shutdown => SignalReaction::Forward,
    }
}

/// The signals `rdrun` blocks from its first instruction (`block_at_startup`, called by the
/// binary before `main`'s first line) until [`Signals::install`] has its handlers: the default
/// `--signals-to-handle` list. Without the block, one of them in rdrun's first milliseconds (before
/// the runtime exists) took its default action and killed rdrun. Blocked, it stays pending and
/// reaches the handler once installed; one the user left out of `--signals-to-handle` then takes
/// its default action, as it would have on arrival.
pub const STARTUP_BLOCKED: [i32; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn startup_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset only write the local set, which is fully initialised by
    // sigemptyset before use; the signal numbers are valid.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for sig in STARTUP_BLOCKED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks [`STARTUP_BLOCKED`] in the calling thread (threads created later inherit the mask).
/// Async-signal-safe and allocation-free, so that it can run before `main`. Worker processes do
/// not inherit the block: `std::process::Command` resets the signal mask before exec.
pub fn block_at_startup() {
    let set = startup_set();
    // SAFETY: pthread_sigmask with a valid set and a null old-set pointer.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Undoes [`block_at_startup`] in the calling thread: pending signals are delivered now (to the
/// handlers [`Signals::install`] has just set up, or by their default action). A no-op when
/// nothing was blocked.
fn release_startup_block() {
    let set = startup_set();
    // SAFETY: as in block_at_startup.
    unsafe {
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Caught signals, in arrival order.
#[derive(Debug)]
pub struct Signals {
    rx: mpsc::UnboundedReceiver<i32>,
    // Keeps the channel open when no signal could be installed, so `recv` pends forever.
    _tx: mpsc::UnboundedSender<i32>,
}

impl Signals {
    /// Installs handlers for `list` (must run inside a tokio runtime). Signals that cannot be
    /// caught (SIGKILL, SIGSTOP, fault signals) are skipped with a warning. Once installed, a
    /// handler stays for the life of the process: the default action (often "terminate") never
    /// comes back, so a late signal can never kill rdrun with workers left behind.
    pub fn install(list: &[i32]) -> Signals {
        let (tx, rx) = mpsc::unbounded_channel();
        for &sig in list {
            match signal(SignalKind::from_raw(sig)) {
                Ok(mut stream) => {
                    if action(sig) == SignalAction::Shutdown {
                        // SAFETY: the action is one atomic store (async-signal-safe); tokio
                        // accepted the signal, so it is not one the registry refuses.
                        let marked = unsafe {
                            signal_hook_registry::register(sig, || {
                                SHUTDOWN_SEEN.store(true, Ordering::SeqCst)
                            })
                        };
                        if let Err(err) = marked {
                            tracing::debug!(
                                "cannot mark {} as a shutdown: {err}",
                                crate::exit::signal_label(sig)
                            );
                        }
                    }
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        while stream.recv().await.is_some() {
                            if tx.send(sig).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(
                        "cannot handle signal {}: {err}",
                        crate::exit::signal_label(sig)
                    );
                }
            }
        }
        // Handlers are in place: signals held since rdrun's first instruction may come now.
        release_startup_block();
        Signals { rx, _tx: tx }
    }

    /// Next caught signal number.
    pub async fn recv(&mut self) -> i32 {
        match self.rx.recv().await {
            Some(sig) => sig,
            // Unreachable while `_tx` lives; pend forever rather than spin.
            None => std::future::pending().await,
        }
    }

    /// A signal that is already queued, if any.
    pub fn try_recv(&mut self) -> Option<i32> {
        self.rx.try_recv().ok()
    }
}

/// In a child between fork and exec: SIGKILL when rdrun (`parent`, its pid before the fork)
/// dies. If rdrun died between the fork and the `prctl`, the death signal would never come, so
/// the child ends itself at once.
///
/// # Safety
/// Only async-signal-safe calls (prctl, getppid, raise): fit for `pre_exec`.
pub(crate) unsafe fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    if libc::prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0,
        0,
        0,
    ) == -1
    {
        return Err(std::io::Error::last_os_error());
    }
    if libc::getppid() != parent {
        libc::raise(libc::SIGKILL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions() {
        let table = [
            (libc::SIGTERM, SignalAction::Shutdown),
            (libc::SIGINT, SignalAction::Shutdown),
            (libc::SIGHUP, SignalAction::Shutdown),
            (libc::SIGQUIT, SignalAction::Shutdown),
            (libc::SIGUSR1, SignalAction::Forward),
            (libc::SIGUSR2, SignalAction::Forward),
        ];
        for (sig, want) in table {
            assert_eq!(action(sig), want, "{}", crate::exit::signal_label(sig));
        }
        assert!(escalates(libc::SIGINT));
        assert!(escalates(libc::SIGTERM));
        assert!(!escalates(libc::SIGHUP));
        assert!(!escalates(libc::SIGUSR1));
    }

    #[test]
    fn reactions() {
        use SignalReaction::*;
        // (signal, interrupted, in_grace, expected)
        let table = [
            (libc::SIGINT, false, false, Shutdown),
            // A failure stop is in its grace: the first Ctrl-C still starts the shutdown.
            (libc::SIGINT, false, true, Shutdown),
            (libc::SIGINT, true, true, KillNow),
            (libc::SIGTERM, true, true, KillNow),
            // SIGINT then SIGTERM escalates too.
            (libc::SIGTERM, true, true, KillNow),
            (libc::SIGHUP, true, true, Forward),
            (libc::SIGQUIT, true, true, Forward),
            // Already past the grace (SIGKILL sent): nothing left to escalate.
            (libc::SIGINT, true, false, Forward),
            (libc::SIGUSR1, false, false, Forward),
            (libc::SIGUSR1, true, true, Forward),
            (libc::SIGUSR2, false, true, Forward),
            (libc::SIGHUP, false, false, Shutdown),
        ];
        for (sig, interrupted, in_grace, want) in table {
            assert_eq!(
                react(sig, interrupted, in_grace),
                want,
                "{} interrupted={interrupted} in_grace={in_grace}",
                crate::exit::signal_label(sig)
            );
        }
    }
}
