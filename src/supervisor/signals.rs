//! OS signals sent to rdrun: which ones are caught, what each one means for the worker group,
//! and the stream of caught signals the agent selects on.
//!
//! Handlers are installed by [`Signals::install`] as the first thing `supervisor::run` does, before
//! any worker exists (torchrun installs its handlers only just before the first spawn, spec
//! torchrun-compat §3.6). Classification is pure ([`action`]); the agent decides what to do.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

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

/// `SIGTERM`-style name of a signal number (`SIG<n>` when unknown).
pub fn name(sig: i32) -> String {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("SIG{sig}"),
    }
}

/// Value of TORCHELASTIC_SIGNALS_TO_HANDLE as torchrun exports it: names joined by commas.
pub fn env_value(signals: &[i32]) -> String {
    signals
        .iter()
        .map(|s| name(*s))
        .collect::<Vec<_>>()
        .join(",")
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
                    tracing::warn!("cannot handle signal {}: {err}", name(sig));
                }
            }
        }
        Signals { rx, _tx: tx }
    }

    /// A stream that never yields (for code paths that must not react to signals).
    pub fn none() -> Signals {
        let (tx, rx) = mpsc::unbounded_channel();
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
            assert_eq!(action(sig), want, "{}", name(sig));
        }
        assert!(escalates(libc::SIGINT));
        assert!(escalates(libc::SIGTERM));
        assert!(!escalates(libc::SIGHUP));
        assert!(!escalates(libc::SIGUSR1));
    }

    #[test]
    fn names() {
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(1000), "SIG1000");
        assert_eq!(
            env_value(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT]),
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        );
        assert_eq!(env_value(&[]), "");
    }
}
