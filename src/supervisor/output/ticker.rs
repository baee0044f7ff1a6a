//! The console writer's alarm clock: a thread that wakes the writer at its next deadline (a
//! collapse window ending, an open line's hold, a progress bar's redraw), so that the writer
//! itself always waits for its next message without a timeout.
//!
//! Why a thread of its own: a wait with a timeout arms a kernel timer on every wait, and the
//! writer waits once per message. With `--output collapse` a deadline is nearly always pending,
//! so every line a worker wrote paid for arming and cancelling a timer: 0.4–1.3 µs a message on
//! the 2-CPU VM of `docs/benchmarks.md` (a virtual machine's timer write leaves the guest), about
//! +16 % of `--output all`'s CPU at 8 ranks × 1000 lines/s each. The deadline changes far less
//! often than messages come (the collapse stage writes what is due in batches), so the alarm
//! re-arms only when it changes, and is woken only when it comes sooner (a later one is found
//! when the thread wakes for the earlier).
//!
//! No crate fits: a timer wheel (tokio's) needs a runtime on the writer's side, and a channel
//! with `select` and a timeout (crossbeam) would still arm a timer on each wait.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

#[derive(Default)]
struct State {
    /// When to wake the writer (`None`: nothing pending).
    at: Option<Instant>,
    /// The writer is gone: the thread ends.
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere never leaves this state half-written: keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer's handle on its alarm thread; dropping it ends the thread.
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    /// The deadline last handed to the thread (so that an unchanged one costs nothing).
    set: Option<Instant>,
}

impl Ticker {
    /// Starts the alarm thread; `wake` is called at each deadline (it sends the writer a wake-up
    /// message) and returns `false` once the writer is gone.
    pub(crate) fn start(wake: impl Fn() -> bool + Send + 'static) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name("rdrun-console-alarm".into())
            .spawn(move || alarm(&theirs, wake))?;
        Ok(Ticker { shared, set: None })
    }

    /// The writer's next deadline (`None`: none): the thread wakes it then, once.
    pub(crate) fn set(&mut self, at: Option<Instant>) {
        if at == self.set {
            return;
        }
        self.set = at;
        let mut st = self.shared.lock();
        let sooner = match (at, st.at) {
            (Some(new), Some(old)) => new < old,
            (Some(_), None) => true,
            (None, _) => false,
        };
        st.at = at;
        drop(st);
        // A later deadline (or none) is found by the thread when it wakes for the earlier one:
        // no wake-up for it now (the deadline moves later each time the writer writes what
        // was due).
        if sooner {
            self.shared.changed.notify_one();
        }
    }

    /// The writer got a wake-up: the deadline it was for is spent, the next [`Ticker::set`]
    /// hands the thread the writer's deadline again even if unchanged.
    pub(crate) fn woke(&mut self) {
        self.set = None;
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_one();
    }
}

fn alarm(shared: &Shared, wake: impl Fn() -> bool) {
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        match st.at {
            None => {
                st = shared
                    .changed
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            Some(at) => {
                let now = Instant::now();
                if now < at {
                    st = shared
                        .changed
                        .wait_timeout(st, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    continue;
                }
                st.at = None;
                drop(st);
                if !wake() {
                    return;
                }
                st = shared.lock();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// One wake-up per deadline, not before it; an unchanged deadline is not re-armed; one
    /// moved later fires at the later time only; a deadline taken back never fires; dropping
    /// the handle ends the thread.
    #[test]
    fn wakes_once_at_each_deadline_and_ends_with_its_handle() {
        let (tx, rx) = mpsc::channel::<Instant>();
        let mut t = Ticker::start(move || tx.send(Instant::now()).is_ok()).unwrap();
        let at = Instant::now() + Duration::from_millis(30);
        t.set(Some(at));
        t.set(Some(at));
        let woke = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(woke >= at);
        // Spent: nothing more until a new deadline.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        t.woke();
        t.set(Some(Instant::now() + Duration::from_millis(20)));
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        t.woke();
        // Moved later (no wake-up of the thread for it): it wakes once, at the later time.
        let first = Instant::now() + Duration::from_millis(20);
        let later = first + Duration::from_millis(60);
        t.set(Some(first));
        t.set(Some(later));
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap() >= later);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        t.woke();
        t.set(Some(Instant::now() + Duration::from_millis(50)));
        t.set(None);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(t);
        // The thread ended: the closure (and its sender) is dropped.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
