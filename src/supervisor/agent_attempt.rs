//! The agent's running of one attempt (`agent.rs` loops over attempts): spawn every local rank
//! through the real spawner, start the attempt's hang watch, then the select loop that turns
//! every wake-up into an [`Event`] — SIGCHLD reaps, handled signals, stop deadlines, rendezvous
//! changes, the worker store's end, the watch task's verdicts — and hands each batch to the
//! attempt's [`Group`], until the group is gone and its [`Outcome`] is known.

use tokio::time::Instant;

use crate::rendezvous::{Assignment, Rendezvous};
use crate::store::server::ServerExit;

use super::{Agent, CAPTURE_VERDICT_SLACK};
use crate::supervisor::group::attempt::{Flow, Group, GroupSettings, Outcome};
use crate::supervisor::group::deadman::Watchdog;
use crate::supervisor::group::effects::Os;
use crate::supervisor::group::events::Event;
use crate::supervisor::group::worker;
use crate::supervisor::nodes::join::watch_opt;
use crate::supervisor::observe::RunEvent;
use crate::supervisor::output::{RankIdentity, RunLogs};
use crate::supervisor::setup::short_host;
use crate::supervisor::watch::files::hang_dir;
use crate::supervisor::watch::link::{ClusterArgs, HangLink};
use crate::supervisor::watch::task::{AttemptWatch, Watch};
use crate::supervisor::watch::verdict::WatchVerdict;
use crate::supervisor::workers::Workers;

impl Agent {
    /// One attempt: spawn every local rank, supervise until the group is gone, collect failures.
    pub(super) async fn attempt(&mut self, logs: &mut RunLogs, asg: &Assignment) -> Outcome {
        let ids: Vec<RankIdentity> = (0..self.config.nproc_per_node)
            .map(|lr| RankIdentity {
                role: self.config.role.clone(),
                rank: asg.base_rank + lr,
                local_rank: worker::reported_local_rank(self.config.cluster.in_place.as_ref(), lr),
                hostname: short_host(&self.host),
            })
            .collect();
        let attempt_logs = logs.attempt(asg.restart_count, &ids);
        if let Some(w) = &self.watchdog {
            match logs.disposable_dir() {
                Some(dir) => w.set_dir(dir),
                None => w.forget_dir(),
            }
        }
        let attempt_logs = match attempt_logs {
            Ok(a) => a,
            Err(err) => {
                return Outcome::LauncherError(format!("cannot prepare the log directory: {err}"))
            }
        };
        self.restart_clock.assigned();
        self.obs.emit(RunEvent::AttemptBegins {
            attempt: asg.restart_count,
            run_dir: logs.run_dir(),
        });
        let (stop_output, _) = tokio::sync::watch::channel(false);
        let watchdog = self.watchdog.as_ref();
        let settings = GroupSettings {
            grace: self.config.shutdown_timeout,
            watchdog_pid: watchdog.map(Watchdog::pid),
            cgroup: watchdog.and_then(Watchdog::cgroup_dir),
            program: self.config.command.program.clone(),
            leftovers: self.config.leftovers,
            static_job: self
                .rdzv
                .as_ref()
                .is_some_and(Rendezvous::uses_rendezvous_store),
        };
        let mut spawner = Workers {
            settings: crate::supervisor::setup::worker_settings(&self.config, &self.worker_env),
            asg,
            logs: &attempt_logs,
            warm: self.warm.as_deref(),
            obs: &self.obs,
            console: &self.console,
            stop_output: &stop_output,
            started: (0, 0),
        };
        let group = Group::spawn(&ids, &mut spawner, settings, Box::new(Os));
        self.back_watch = self.restart_cost(spawner.started).and_then(|cost| {
            let ranks = group.watched_ranks().into_iter().map(|r| r.output);
            crate::supervisor::report::restart_cost::BackWatch::new(&cost, ranks.collect())
        });
        self.chaos_started(asg, &group);
        // Watching starts with the workers (the hang budget counts from the spawn).
        let mut watch = AttemptWatch::default();
        if !group.launch_failed() {
            let dir = hang_dir(
                self.config.log.log_dir.as_deref(),
                attempt_logs.dir.as_deref(),
                &self.config.rdzv.run_id,
                asg.restart_count,
                &self.config.run_env.temp_dir(),
            );
            watch = AttemptWatch {
                ranks: group.watched_ranks(),
                hang: HangLink::new(
                    // `--debug-rank`: that rank's pauses are no hang.
                    &crate::config::hang::HangSettings {
                        debug_rank: self.config.console.debug_rank.map(|r| r as u32),
                        ..self.config.hang.clone()
                    },
                    dir.clone(),
                    ClusterArgs::of(self.rdzv.as_ref(), asg),
                ),
                dstate: self.config.torch_env.uninterruptible_timeout,
                // A FileTimer expiry is captured into the same directory, detection on or off.
                capture: self.file_timer.then(|| (self.config.hang.clone(), dir)),
                store: self.worker_store().cloned(),
            };
        }
        if let Some(w) = self.watch.as_mut() {
            w.attempt(watch);
        }
        self.supervise(group, &stop_output).await
    }

    /// The store rdrun hosts for the workers, if any (the worker store, or the static
    /// rendezvous store the workers share).
    fn worker_store(&self) -> Option<&std::sync::Arc<crate::store::state::Store>> {
        self.store
            .as_ref()
            .or_else(|| self.rdzv.as_ref().and_then(|r| r.server.as_ref()))
            .map(|s| s.store())
    }

    /// The select loop of one attempt: every wake-up becomes a batch of [`Event`]s; the
    /// observer sees each, the watch task learns of exits, and the group handles the batch
    /// until it says the attempt is over (the group stops itself on the first failure, on a
    /// shutdown signal, on a rendezvous change or a kill verdict).
    async fn supervise(
        &mut self,
        mut group: Group,
        stop_output: &tokio::sync::watch::Sender<bool>,
    ) -> Outcome {
        // Exits that happened before the SIGCHLD stream saw them are picked up here.
        let mut pending: Vec<Event> = reaped_events();
        loop {
            for event in &pending {
                self.observe(event);
            }
            let flow = group.handle(pending.drain(..));
            self.chaos_stop_began(&group);
            self.restarts_disabled |= group.disables_restarts();
            self.obs.emit(RunEvent::StopProgress {
                stop: group.stop(),
                live: group.live(),
            });
            if !group.judging() {
                if let Some(w) = self.watch.as_mut() {
                    w.pause();
                }
            }
            if flow == Flow::Over {
                self.capture_verdict(&mut group).await;
                self.obs.emit(RunEvent::AttemptOver);
                let stop_began = group.stop().sent_at();
                let outcome = group.finish(stop_output).await;
                self.chaos_over(outcome.first_failure_at(), stop_began);
                // Once the pumps drained every pipe: ranks that printed before the attempt
                // ended count; one that never did leaves the restart without the measure.
                self.check_back();
                self.back_watch = None;
                self.restart_clock
                    .attempt_over(outcome.first_failure_at(), stop_began);
                return outcome;
            }
            let deadline = group.stop().deadline();
            let poll_leftovers = group.polls_leftovers();
            let watch_rdzv = self.rdzv.is_some() && group.watch_rdzv();
            let chaos = self.chaos_wake();
            tokio::select! {
                ev = watch_opt(self.rdzv.as_mut()), if watch_rdzv => pending.push(Event::Rendezvous(ev)),
                _ = self.sigchld.recv() => pending.extend(reaped_events()),
                sig = self.signals.recv() => pending.push(Event::Signal(sig)),
                exit = &mut self.store_closed, if self.store_failed.is_none() => {
                    let why = match exit {
                        ServerExit::Shutdown => "shut down".to_string(),
                        ServerExit::Failed(msg) => msg,
                    };
                    self.store_failed = Some(why.clone());
                    pending.push(Event::StoreStopped(why));
                }
                _ = sleep_until_opt(deadline), if deadline.is_some() => pending.push(Event::Deadline),
                _ = tokio::time::sleep(group.leftover_poll()), if poll_leftovers => pending.push(Event::LeftoverPoll),
                v = next_verdict(self.watch.as_mut()) => pending.push(Event::Watch(v)),
                // A restarted attempt's ranks back in user code: their first output's time is
                // recorded by the pumps; this only decides when to say it.
                _ = tokio::time::sleep(BACK_POLL), if self.back_watch.is_some() => self.check_back(),
                // `--chaos`: a fault due, or its progress reader (issue 41).
                _ = sleep_until_opt(chaos), if chaos.is_some() => self.chaos_tick(&group),
            }
        }
    }

    /// The workers are gone while a kill verdict's capture runs (they failed under it): its
    /// verdict, bounded by the capture's own bounds, is the failure's root cause and its block
    /// is shown, as when the capture ended first.
    async fn capture_verdict(&mut self, group: &mut Group) {
        let Some(watch) = self.watch.as_mut().filter(|_| group.capturing()) else {
            return;
        };
        let bound = self.config.hang.capture_timeout + CAPTURE_VERDICT_SLACK;
        match tokio::time::timeout(bound, watch.next()).await {
            Ok(v) => {
                let ev = Event::Watch(v);
                self.observe(&ev);
                group.handle([ev]);
            }
            Err(_) => tracing::warn!("the hang capture did not end within {bound:?}"),
        }
    }

    /// What the observer and the watch task learn of an event before the group handles it.
    fn observe(&mut self, event: &Event) {
        match event {
            Event::Reaped { pid, status } => {
                self.obs.emit(RunEvent::Reaped {
                    pid: *pid,
                    status: *status,
                });
                if let Some(w) = self.watch.as_ref() {
                    w.exited(*pid, status.torchrun_code());
                }
            }
            Event::Signal(sig) => self.obs.emit(RunEvent::Signal(*sig)),
            // A D-state verdict is the attempt's error line, as before the watch task existed.
            Event::Watch(
                WatchVerdict::Hang { found, .. }
                | WatchVerdict::TimerExpired {
                    found: Some(found), ..
                },
            ) => self.obs.emit(RunEvent::Hang(found)),
            _ => {}
        }
    }
}

/// Every child reaped now, as events.
fn reaped_events() -> Vec<Event> {
    worker::reap()
        .into_iter()
        .map(|(pid, status)| Event::Reaped { pid, status })
        .collect()
}

/// The watch task's next verdict; never without one.
async fn next_verdict(watch: Option<&mut Watch>) -> WatchVerdict {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// How often a restarted attempt's ranks are looked at until all printed (`check_back`).
const BACK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
