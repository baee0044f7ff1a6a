//! Which rank to blame for a hang, from what the capture found (pure). In order: with Python
//! stacks, the ranks not waiting inside a collective while others are (a rank in DDP's
//! backward or autograd's engine waits for the others; one waiting on its own
//! `threading.Event`, queue or lock, or on a DataLoader whose worker is stuck, is the cause);
//! when none waits in a collective, the ranks with a stuck child process; the rank that never
//! set a store key another waits on; the odd top frame; without stacks, the odd kernel wait.

use super::children::ChildCapture;
use super::frames::{classify, describe, StackKind};
use super::record::RankCapture;

/// The rank(s) that differ, and why (empty without suspects).
pub fn pick_suspects(ranks: &[RankCapture]) -> (Vec<u32>, String) {
    let stacked: Vec<(&RankCapture, StackKind)> = ranks
        .iter()
        .filter(|r| !r.main_frames.is_empty())
        .map(|r| (r, classify(&r.main_frames)))
        .collect();
    if stacked.len() >= 2 {
        let not_waiting: Vec<&(&RankCapture, StackKind)> = stacked
            .iter()
            .filter(|(_, k)| *k != StackKind::Collective)
            .collect();
        if !not_waiting.is_empty() && not_waiting.len() < stacked.len() {
            let (first, kind) = not_waiting[0];
            let why = match detail(first, kind) {
                Some(d) => format!("not in a collective: {d}"),
                None => "not in a collective".to_string(),
            };
            return (not_waiting.iter().map(|(r, _)| r.rank).collect(), why);
        }
        // Nobody waits in a collective (all wait on their DataLoaders, say): the ranks whose
        // child process is stuck, when not all have one.
        if not_waiting.len() == stacked.len() {
            let stuck: Vec<(u32, &ChildCapture)> = ranks
                .iter()
                .filter_map(|r| Some((r.rank, stuck_child(r)?)))
                .collect();
            if let (Some((_, c)), true) = (stuck.first(), stuck.len() < ranks.len()) {
                let why = format!("its {}", child_text(c));
                return (stuck.iter().map(|(r, _)| *r).collect(), why);
            }
        }
    }
    if let Some(found) = missing_setters(ranks) {
        return found;
    }
    if stacked.len() >= 2 {
        if let Some(odd) = odd_one_out(
            stacked
                .iter()
                .map(|(r, _)| (r.rank, r.top_frame().unwrap_or(""))),
        ) {
            return (odd, "top frame differs from the other ranks".to_string());
        }
    }
    let waits = ranks.iter().filter_map(|r| Some((r.rank, r.main_wchan()?)));
    if let Some(odd) = odd_one_out(waits) {
        return (odd, "kernel wait differs from the other ranks".to_string());
    }
    (Vec::new(), String::new())
}

/// The first child process of the rank whose user code is stuck.
fn stuck_child(r: &RankCapture) -> Option<&ChildCapture> {
    r.children.iter().find(|c| c.stuck())
}

/// `DataLoader worker pid 8035 is stuck in stuck_forever (train.py:29)`.
fn child_text(c: &ChildCapture) -> String {
    let loader = c
        .main_frames
        .iter()
        .any(|f| f.starts_with("_worker_loop ("));
    let what = if loader {
        "DataLoader worker"
    } else {
        "child process"
    };
    let at = describe(&c.main_frames).unwrap_or_default();
    format!("{what} pid {} is stuck in {at}", c.pid)
}

/// What a rank not in a collective does instead, when there is more to say than that.
fn detail(r: &RankCapture, kind: &StackKind) -> Option<String> {
    let child = stuck_child(r).map(child_text);
    match (kind, child) {
        (StackKind::DataLoader, Some(c)) => Some(format!("waits on its DataLoader; its {c}")),
        (StackKind::DataLoader, None) => Some("waits on its DataLoader workers".to_string()),
        (StackKind::OwnWait { call, user }, _) => {
            Some(format!("waits in {call} from its own code {user}"))
        }
        (_, Some(c)) => Some(format!("its {c}")),
        _ => None,
    }
}

/// The rank a waited-on key names as its setter: the key's last number (`/ready/1`,
/// `rank_3`, `store_based_barrier_key:2` → 1, 3, 2), when it is one of `ranks`.
pub fn expected_setter(key: &str, ranks: &[u32]) -> Option<u32> {
    let digits: String = key
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let before = key[..key.len() - digits.len()].chars().last();
    if digits.is_empty() || !matches!(before, Some('/' | '_' | ':' | '-' | '.')) {
        return None;
    }
    let n: u32 = digits.parse().ok()?;
    ranks.contains(&n).then_some(n)
}

/// The store rule: ranks that should have set a key others wait on (named by
/// [`expected_setter`]) and are not themselves waiting on it.
fn missing_setters(ranks: &[RankCapture]) -> Option<(Vec<u32>, String)> {
    let ids: Vec<u32> = ranks.iter().map(|r| r.rank).collect();
    let mut found: Vec<u32> = Vec::new();
    let mut why = String::new();
    for r in ranks {
        for w in &r.store_waits {
            let Some(setter) = expected_setter(&w.key, &ids) else {
                continue;
            };
            let setter_waits_too = ranks
                .iter()
                .any(|o| o.rank == setter && o.store_waits.iter().any(|x| x.key == w.key));
            if setter == r.rank || setter_waits_too || found.contains(&setter) {
                continue;
            }
            if why.is_empty() {
                why = format!(
                    "never set store key {:?} that rank {} waits on",
                    w.key, r.rank
                );
            }
            found.push(setter);
        }
    }
    found.sort_unstable();
    (!found.is_empty()).then_some((found, why))
}

/// The members of the smaller groups when one group holds a strict majority of ≥ 2.
fn odd_one_out<'a>(items: impl Iterator<Item = (u32, &'a str)>) -> Option<Vec<u32>> {
    let items: Vec<(u32, &str)> = items.collect();
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, k) in &items {
        *counts.entry(k).or_default() += 1;
    }
    let (major, n) = counts.iter().max_by_key(|(_, n)| **n)?;
    if *n < 2 || *n * 2 <= items.len() || *n == items.len() {
        return None;
    }
    Some(
        items
            .iter()
            .filter(|(_, k)| k != major)
            .map(|(r, _)| *r)
            .collect(),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::supervisor::watch::hang::pyspy::{parse_py_spy_main_frames, StackStatus};
    use crate::supervisor::watch::hang::record::{StoreWait, ThreadWait};
    use crate::supervisor::watch::hang::sample::ProcState;
    use std::time::Duration;

    /// A sleeping rank with these main-thread frames (also used by `capture.rs`'s tests).
    pub(in crate::supervisor::watch::hang) fn rc(
        rank: u32,
        frames: &[&str],
        wchan: &str,
    ) -> RankCapture {
        RankCapture {
            rank,
            pid: rank as i32 + 100,
            state: Some(ProcState::Sleeping),
            threads: vec![ThreadWait {
                tid: rank as i32 + 100,
                name: "python".into(),
                state: Some(ProcState::Sleeping),
                wchan: Some(wchan.into()),
                syscall: Some(202),
            }],
            stack_status: if frames.is_empty() {
                StackStatus::Unavailable("x".into())
            } else {
                StackStatus::Ok
            },
            stack: String::new(),
            main_frames: frames.iter().map(|s| s.to_string()).collect(),
            last_output: vec![],
            store_waits: vec![],
            children: vec![],
        }
    }

    /// A rank from a real `py-spy dump --full-filenames` text (testdata/).
    fn real(rank: u32, dump: &str) -> RankCapture {
        let mut r = rc(rank, &[], "futex_do_wait");
        r.stack_status = StackStatus::Ok;
        r.stack = dump.to_string();
        r.main_frames = parse_py_spy_main_frames(dump);
        assert!(!r.main_frames.is_empty(), "{dump}");
        r
    }

    fn child(pid: i32, dump: &str) -> ChildCapture {
        ChildCapture {
            pid,
            ppid: 101,
            stack_status: StackStatus::Ok,
            stack: dump.to_string(),
            main_frames: parse_py_spy_main_frames(dump),
        }
    }

    const EVENT_0: &str = include_str!("testdata/ddp_event_rank0.txt");
    const EVENT_1: &str = include_str!("testdata/ddp_event_rank1.txt");
    const LOADER_0: &str = include_str!("testdata/ddp_loader_rank0.txt");
    const LOADER_1: &str = include_str!("testdata/ddp_loader_rank1.txt");
    const STUCK_WORKER: &str = include_str!("testdata/ddp_loader_rank1_stuck_worker.txt");
    const IDLE_WORKER: &str = include_str!("testdata/ddp_loader_rank1_idle_worker.txt");

    /// Issue 24: gloo DDP, rank 1 waits on a threading.Event in its step, rank 0 waits in
    /// DDP's backward (autograd's engine). Rank 1 is the suspect, and the reason says where.
    #[test]
    fn ddp_event_wait_names_the_waiting_rank_not_the_one_in_backward() {
        let ranks = [real(0, EVENT_0), real(1, EVENT_1)];
        let (s, why) = pick_suspects(&ranks);
        assert_eq!(s, vec![1], "{why}");
        assert_eq!(
            why,
            "not in a collective: waits in Event.wait from its own code \
             wait_for_the_signal (hang_ddp_event.py:28)"
        );
        // Either order of ranks.
        assert_eq!(
            pick_suspects(&[real(0, EVENT_1), real(1, EVENT_0)]).0,
            vec![0]
        );
    }

    /// Issue 24: gloo DDP, rank 1's DataLoader worker is stuck in the dataset: rank 1 (waiting
    /// on its DataLoader) is the suspect, and the reason names the stuck worker; rank 0's idle
    /// workers change nothing.
    #[test]
    fn ddp_stuck_dataloader_worker_names_its_rank_and_the_worker() {
        let mut r0 = real(0, LOADER_0);
        r0.children = vec![child(201, IDLE_WORKER), child(202, IDLE_WORKER)];
        let mut r1 = real(1, LOADER_1);
        r1.children = vec![child(301, STUCK_WORKER), child(302, IDLE_WORKER)];
        let (s, why) = pick_suspects(&[r0.clone(), r1.clone()]);
        assert_eq!(s, vec![1], "{why}");
        assert_eq!(
            why,
            "not in a collective: waits on its DataLoader; its DataLoader worker pid 301 is \
             stuck in stuck_forever (hang_ddp_loader.py:29)"
        );
        // Without the children's stacks, rank 1 is still the one (it waits on its loader).
        let mut bare = r1.clone();
        bare.children.clear();
        let (s, why) = pick_suspects(&[r0.clone(), bare]);
        assert_eq!(
            (s, why.as_str()),
            (
                vec![1],
                "not in a collective: waits on its DataLoader workers"
            )
        );
        // No DDP (nobody waits in a collective), every rank waits on its DataLoader: the rank
        // whose worker is stuck.
        let mut r0b = real(0, LOADER_1);
        r0b.children = vec![child(201, IDLE_WORKER)];
        let (s, why) = pick_suspects(&[r0b.clone(), r1.clone()]);
        assert_eq!(s, vec![1], "{why}");
        assert!(why.starts_with("its DataLoader worker pid 301 is stuck in stuck_forever"));
        // Both stuck: no odd one out (identical stacks, same kernel wait): nobody named.
        r0b.children = vec![child(201, STUCK_WORKER)];
        assert!(pick_suspects(&[r0b, r1]).0.is_empty());
    }

    /// The stdlib waits that used to count as "in a collective" no longer hide the cause.
    #[test]
    fn a_queue_or_lock_wait_in_user_code_is_not_a_collective() {
        let ar = [
            "all_reduce (torch/distributed/distributed_c10d.py:4181)",
            "wrapper (torch/distributed/c10d_logger.py:81)",
            "step (train.py:20)",
        ];
        let q = [
            "Condition.wait (threading.py:327)",
            "Queue.get (queue.py:171)",
            "next_batch (train.py:12)",
        ];
        let (s, why) = pick_suspects(&[rc(0, &ar, "f"), rc(1, &q, "f"), rc(2, &ar, "f")]);
        assert_eq!(s, vec![1]);
        assert_eq!(
            why,
            "not in a collective: waits in Queue.get from its own code next_batch (train.py:12)"
        );
    }

    #[test]
    fn suspect_is_the_rank_not_in_a_collective() {
        let ranks = [
            rc(
                0,
                &[
                    "all_reduce (torch/distributed/distributed_c10d.py:4181)",
                    "<module> (t.py:12)",
                ],
                "futex_do_wait",
            ),
            rc(1, &["<module> (t.py:10)"], "hrtimer_nanosleep"),
        ];
        let (s, why) = pick_suspects(&ranks);
        assert_eq!(s, vec![1]);
        assert_eq!(why, "not in a collective");
    }

    #[test]
    fn suspect_is_the_odd_top_frame_when_all_wait() {
        let a = "all_reduce (torch/distributed/distributed_c10d.py:4181)";
        let b = "barrier (torch/distributed/distributed_c10d.py:4700)";
        let ranks = [
            rc(0, &[a], "f"),
            rc(1, &[a], "f"),
            rc(2, &[b], "f"),
            rc(3, &[a], "f"),
        ];
        assert_eq!(pick_suspects(&ranks).0, vec![2]);
        // No majority: no suspect.
        let ranks = [rc(0, &[a], "f"), rc(1, &[b], "f")];
        assert!(pick_suspects(&ranks).0.is_empty());
    }

    #[test]
    fn store_rule_names_the_missing_setter() {
        let ids = [0, 1, 2, 3];
        assert_eq!(expected_setter("/ready/1", &ids), Some(1));
        assert_eq!(expected_setter("rank_3", &ids), Some(3));
        assert_eq!(expected_setter("store_based_barrier_key:2", &ids), Some(2));
        assert_eq!(expected_setter("/ready/7", &ids), None, "not a rank");
        assert_eq!(expected_setter("v2", &ids), None, "no separator");
        assert_eq!(expected_setter("/x/", &ids), None);
        let wait = |key: &str| StoreWait {
            key: key.into(),
            age: Duration::from_secs(30),
        };
        // No stacks; rank 0 waits for rank 1's key; kernel waits alike.
        let mut a = rc(0, &[], "futex_do_wait");
        a.store_waits = vec![wait("/ready/1")];
        let b = rc(1, &[], "futex_do_wait");
        let (s, why) = pick_suspects(&[a.clone(), b.clone()]);
        assert_eq!(s, vec![1]);
        assert!(
            why.contains("\"/ready/1\"") && why.contains("rank 0"),
            "{why}"
        );
        // A setter that waits on the same key (a barrier of all) is not the culprit.
        let mut b2 = b.clone();
        b2.store_waits = vec![wait("/ready/1")];
        assert!(pick_suspects(&[a.clone(), b2]).0.is_empty());
        // The stack rule comes first.
        let c = rc(
            0,
            &["all_reduce (torch/distributed/distributed_c10d.py:1)"],
            "f",
        );
        let d = rc(1, &["idle (t.py:3)"], "f");
        let mut d2 = d.clone();
        d2.store_waits = vec![wait("/k/0")];
        assert_eq!(pick_suspects(&[c, d2]).0, vec![1]);
    }

    #[test]
    fn without_stacks_the_odd_kernel_wait() {
        let ranks = [
            rc(0, &[], "futex_do_wait"),
            rc(1, &[], "hrtimer_nanosleep"),
            rc(2, &[], "futex_do_wait"),
        ];
        let (s, why) = pick_suspects(&ranks);
        assert_eq!(s, vec![1]);
        assert!(why.contains("kernel wait"));
        let same = [rc(0, &[], "futex_do_wait"), rc(1, &[], "futex_do_wait")];
        assert!(pick_suspects(&same).0.is_empty());
    }
}
