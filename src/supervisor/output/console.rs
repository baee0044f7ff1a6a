//! The console writer: one thread per [`Console`] owns rdrun's stdout and stderr (the
//! process-wide one writes to them under their std locks, which `tracing` also takes). Each
//! message is a run of whole lines of one worker, written with one `write_all` + `flush`, so
//! ranks never interleave mid-line. The forwarders never block a runtime thread on a slow
//! terminal: they wait (async) on a byte budget ([`CONSOLE_BUDGET`]) that the writer thread
//! returns after each write.

use std::io::{self, Write};
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Console bytes queued (all workers together) before forwarders wait for the terminal.
pub const CONSOLE_BUDGET: usize = 4 << 20;

/// Which console stream a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

enum ConsoleMsg {
    Data {
        stream: Stream,
        bytes: Vec<u8>,
        _permit: OwnedSemaphorePermit,
    },
    Flush(oneshot::Sender<()>),
}

/// A console: one writer thread owning a stdout and a stderr writer. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    tx: mpsc::UnboundedSender<ConsoleMsg>,
    budget: Arc<Semaphore>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// Starts a writer thread over these writers (tests pass in-memory writers).
    pub fn new(
        mut stdout: Box<dyn Write + Send>,
        mut stderr: Box<dyn Write + Send>,
    ) -> io::Result<Console> {
        let (tx, mut rx) = mpsc::unbounded_channel::<ConsoleMsg>();
        std::thread::Builder::new()
            .name("rdrun-console".into())
            .spawn(move || {
                let mut broken = [false, false];
                while let Some(msg) = rx.blocking_recv() {
                    match msg {
                        ConsoleMsg::Data { stream, bytes, .. } => {
                            let (w, i) = match stream {
                                Stream::Stdout => (&mut stdout, 0),
                                Stream::Stderr => (&mut stderr, 1),
                            };
                            // A closed console (`rdrun … | head`) drops output; workers go on.
                            if let Err(e) = w.write_all(&bytes).and_then(|()| w.flush()) {
                                if !broken[i] {
                                    broken[i] = true;
                                    tracing::debug!(error = %e, "console write failed");
                                }
                            }
                        }
                        ConsoleMsg::Flush(ack) => {
                            let _ = stdout.flush();
                            let _ = stderr.flush();
                            let _ = ack.send(());
                        }
                    }
                }
            })?;
        Ok(Console {
            tx,
            budget: Arc::new(Semaphore::new(CONSOLE_BUDGET)),
        })
    }

    /// The process-wide console: rdrun's own stdout and stderr.
    pub fn global() -> Console {
        static GLOBAL: OnceLock<Console> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                Console::new(Box::new(io::stdout()), Box::new(io::stderr()))
                    .expect("cannot start the console writer thread")
            })
            .clone()
    }

    /// Queues whole lines for `stream`; waits while [`CONSOLE_BUDGET`] bytes are queued.
    pub async fn write(&self, stream: Stream, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let n = bytes.len().clamp(1, CONSOLE_BUDGET) as u32;
        let Ok(permit) = self.budget.clone().acquire_many_owned(n).await else {
            return; // the semaphore is never closed
        };
        let _ = self.tx.send(ConsoleMsg::Data {
            stream,
            bytes,
            _permit: permit,
        });
    }

    /// Waits until everything queued before this call is written and flushed.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(ConsoleMsg::Flush(ack)).is_ok() {
            let _ = done.await;
        }
    }
}
