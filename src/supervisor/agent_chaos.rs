//! The agent's side of chaos mode (issue 41): the chaos module (`chaos/`) decides what to
//! inject and measures; the agent acts — it signals the workers it spawned, ends its own node
//! for `node-loss`, reports the events, and at the end prints the table and fails the check
//! for a fault not survived. Each method is one call site of `agent.rs` / `agent_attempt.rs`
//! / `agent_between.rs`.

use std::time::SystemTime;

use super::Agent;
use crate::rendezvous::Assignment;
use crate::supervisor::chaos::{Act, Cause, Chaos, ChaosEvent, Injected, Layout, Target};
use crate::supervisor::group::attempt::{Group, Outcome};
use crate::supervisor::nodes::root_cause;
use crate::supervisor::observe::RunEvent;
use crate::supervisor::output::own;
use crate::supervisor::report::end::RunEnd;

impl Agent {
    /// `--chaos` typed against this run (`Err`: the one line of a bad spec), and its start
    /// lines said.
    pub(super) fn chaos_of(config: &crate::config::LaunchConfig) -> Result<Option<Chaos>, String> {
        let Some(c) = config.chaos.as_ref() else {
            return Ok(None);
        };
        let hang_kills = config.hang.mode == crate::config::hang::HangMode::Kill;
        let multi = config.uses_rendezvous() && config.nnodes.max > 1;
        let chaos = Chaos::of_spec(
            c.spec.clone(),
            c.progress.as_deref(),
            hang_kills,
            multi,
            &config.rdzv.run_id,
        )?;
        if let Some(mut chaos) = chaos {
            for line in chaos.start_lines() {
                tracing::warn!("{line}");
            }
            return Ok(Some(chaos));
        }
        Ok(None)
    }

    /// The attempt's workers were spawned: chaos learns where its ranks are.
    pub(super) fn chaos_started(&mut self, asg: &Assignment, group: &Group) {
        let Some(chaos) = self.chaos.as_mut() else {
            return;
        };
        let ranks = group.watched_ranks();
        let layout = Layout {
            node: asg.group_rank,
            nodes: asg.group_world_size,
            world_size: asg.world_size,
            local: ranks
                .iter()
                .map(|r| Target {
                    rank: r.rank as usize,
                    pid: r.pid,
                })
                .collect(),
        };
        chaos.attempt_started(
            asg.restart_count,
            layout,
            ranks.into_iter().map(|r| r.last).collect(),
        );
    }

    /// When the select loop must wake for chaos.
    pub(super) fn chaos_wake(&mut self) -> Option<tokio::time::Instant> {
        self.chaos
            .as_mut()?
            .wake()
            .map(tokio::time::Instant::from_std)
    }

    /// A chaos wake-up: what is due is injected while the group runs untouched (every worker
    /// alive, no stop, no verdict). Only workers of this attempt, alive and not reaped (so
    /// their PIDs cannot have been reused), are signalled.
    pub(super) fn chaos_tick(&mut self, group: &Group) {
        let Some(chaos) = self.chaos.as_mut() else {
            return;
        };
        let untouched = group.judging() && group.live() == group.watched_ranks().len();
        for (idx, act) in chaos.tick(untouched) {
            if let Act::Toggle { pid, signal } = act {
                // A `slow` rank's duty cycle: the pid is still an unreaped worker (a stop
                // began ends the cycle first).
                let _ = send(pid, signal);
                continue;
            }
            tracing::warn!("{}", chaos.act_line(idx));
            let done = match &act {
                Act::Signal { pid, signal } => send(*pid, *signal),
                // The duty cycle is driven by the ticks that follow.
                Act::Throttle { .. } | Act::Toggle { .. } => Ok(()),
                Act::EndNode { pids } => {
                    for pid in pids {
                        let _ = send(*pid, libc::SIGKILL);
                    }
                    tracing::warn!("chaos: node-loss: this node's agent ends now (SIGKILL)");
                    flush_before_death();
                    // As if the machine died: no report, no close, nothing said to the others.
                    // SAFETY: plain kill(2) of rdrun itself; the watchdog and every worker's
                    // parent-death signal end what remains.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                    Ok(())
                }
            };
            if let Err(why) = &done {
                tracing::warn!("chaos: fault not injected: {why}");
            }
            if let (Act::Signal { pid, signal }, Ok(()), Some(w)) = (&act, &done, &self.watch) {
                if *signal == libc::SIGSTOP {
                    w.stopped_by_rdrun(*pid);
                }
            }
            chaos.injected(idx, &act, done);
        }
        self.chaos_report();
    }

    /// The stop of the attempt began: a worker a `hang` stopped is continued, so that it takes
    /// the stop's signal at once (no stopped process is ever left behind).
    pub(super) fn chaos_stop_began(&mut self, group: &Group) {
        if group.stop().sent_at().is_none() {
            return;
        }
        if let Some(chaos) = self.chaos.as_mut() {
            for pid in chaos.stop_began() {
                let _ = send(pid, libc::SIGCONT);
            }
        }
    }

    /// The attempt is over: chaos measures the detection of a fault it caused.
    pub(super) fn chaos_over(&mut self, failed: Option<SystemTime>, stop: Option<SystemTime>) {
        if let Some(chaos) = self.chaos.as_mut() {
            chaos.attempt_over(failed, stop);
        }
    }

    /// What chaos knows of the attempt's end: a fault caused it (`here`: this node injected it;
    /// else this node's clock drew it landing elsewhere).
    pub(super) fn chaos_cause(&mut self) -> Option<Cause> {
        self.chaos.as_mut()?.take_cause()
    }

    /// This node's root-cause entry of the attempt that ended with `outcome`, and what chaos
    /// knows of that end ([`Agent::chaos_cause`]): the entry carries a fault this node injected
    /// itself (a fault its clock saw land elsewhere is the other node's to tell).
    pub(super) fn own_entry(&mut self, outcome: &Outcome) -> (root_cause::Entry, Option<Cause>) {
        let cause = self.chaos_cause();
        let entry = root_cause::Entry {
            injected: cause
                .as_ref()
                .filter(|c| c.here)
                .map(|c| c.injected.clone()),
            ..root_cause::Entry::of(outcome)
        };
        (entry, cause)
    }

    /// The label of the attempt's failure when a fault caused it (it then counts toward
    /// neither the stop verdict nor the failure counts): this node's own fault; else the one
    /// the nodes agreed on (`run`: another node injected it, and this node's clock catches
    /// up with it); else the one this node's clock saw land elsewhere (the exchange did not
    /// answer).
    pub(super) fn chaos_label(
        &mut self,
        own: Option<Cause>,
        run: Option<Injected>,
    ) -> Option<String> {
        let chaos = self.chaos.as_mut()?;
        match (own, run) {
            (Some(c), _) if c.here => Some(c.injected.label),
            (_, Some(fault)) => Some(chaos.agreed(&fault)),
            (Some(c), None) => Some(c.injected.label),
            (None, None) => None,
        }
    }

    /// The restart after an attempt spawned its workers (`failed_at`: what its back-in-user-code
    /// mark counts from), and that mark once it came.
    pub(super) fn chaos_restarted(&mut self, failed_at: SystemTime) {
        if let Some(chaos) = self.chaos.as_mut() {
            chaos.restarted(failed_at);
        }
    }

    pub(super) fn chaos_back(&mut self, back: std::time::Duration) {
        if let Some(chaos) = self.chaos.as_mut() {
            chaos.back(back);
        }
        self.chaos_report();
    }

    /// Hands chaos's events to the observer.
    fn chaos_report(&mut self) {
        let Some(chaos) = self.chaos.as_mut() else {
            return;
        };
        for ev in chaos.events() {
            match &ev {
                ChaosEvent::Inject(fields) => self.obs.emit(RunEvent::ChaosInject { fields }),
                ChaosEvent::Recovered {
                    kind,
                    detect,
                    recover,
                    fields,
                } => self.obs.emit(RunEvent::ChaosRecovered {
                    kind,
                    detect: *detect,
                    recover: *recover,
                    fields,
                }),
            }
        }
    }

    /// The run is over: the table, the events still due, and the check — a fault not survived
    /// makes the run fail (exit ≠ 0) with one line naming it. Returns the end and the
    /// `--report-json` section.
    pub(super) fn chaos_end(&mut self, end: RunEnd) -> (RunEnd, Option<serde_json::Value>) {
        let Some(chaos) = self.chaos.as_mut() else {
            return (end, None);
        };
        let finish = chaos.finish(matches!(end, RunEnd::Succeeded));
        self.chaos_report();
        for line in &finish.table {
            own::stderr_line(line);
        }
        for line in &finish.not_survived {
            own::stderr_line(line);
        }
        let end = match (end, finish.not_survived.first()) {
            (RunEnd::Succeeded, Some(line)) => RunEnd::error(line.clone()),
            (end, _) => end,
        };
        (end, Some(finish.json))
    }
}

/// What rdrun said so far reaches the terminal before a `node-loss` ends it: the console's
/// writer is a thread of this process. The wait runs on a thread of its own (the flush blocks,
/// which the agent's runtime thread may not) and is bounded, so that a terminal that does not
/// read cannot keep the node alive.
fn flush_before_death() {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("chaos-flush".into())
        .spawn(move || {
            own::flush();
            let _ = tx.send(());
        });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(std::time::Duration::from_secs(2));
    }
}

/// kill(2) of a worker rdrun spawned and has not reaped.
fn send(pid: i32, signal: i32) -> Result<(), String> {
    // SAFETY: plain kill(2); `pid` is an unreaped child of rdrun (the caller checks), so it
    // names that process and no other.
    match unsafe { libc::kill(pid, signal) } {
        0 => Ok(()),
        _ => Err(format!(
            "cannot signal pid {pid}: {}",
            std::io::Error::last_os_error()
        )),
    }
}
