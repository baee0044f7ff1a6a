//! Where a fault lands and what the agent does for it (issue 41): the planned fault's rank or
//! node resolved against the running attempt (a seeded draw for `random`), and the act the
//! agent performs — a signal to one worker it spawned, or the end of the whole node. Pure: the
//! agent sends the signals (it spawned the workers; rdrun signals only what it started).

use super::schedule::choose;
use crate::config::chaos::{FaultSpec, Kind, Pick};

/// One worker of the running attempt, as the injector sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub rank: usize,
    pub pid: i32,
}

/// The running attempt's layout: which global ranks live on this node, among how many nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub node: usize,
    pub nodes: usize,
    pub world_size: usize,
    pub local: Vec<Target>,
}

/// What the agent does for a fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// Send `signal` to the worker `pid` (SIGKILL for `kill`, SIGSTOP for `hang`).
    Signal { pid: i32, signal: i32 },
    /// Throttle the worker `pid` to `pct` % of one core for `secs`.
    Throttle { pid: i32, pct: f64, secs: f64 },
    /// SIGKILL this node's workers (`pids`), then the agent itself.
    EndNode { pids: Vec<i32> },
    /// A step of a `slow` fault's duty cycle: send `signal` (SIGSTOP, SIGCONT) to `pid`; the
    /// fault itself was reported when it began.
    Toggle { pid: i32, signal: i32 },
}

/// Where the fault `spec` with draw `draw` lands: `Ok(Some)` here, `Ok(None)` on another node
/// (this node only counts it), `Err` when it cannot land anywhere (a rank beyond the world).
pub fn land(
    spec: &FaultSpec,
    draw: u64,
    at: &Layout,
) -> Result<Option<(Option<Target>, Act)>, String> {
    // Each random choice takes its own bits of the one draw, so a node and a rank chosen
    // together are independent.
    let node_draw = draw;
    let rank_draw = draw.rotate_left(32);
    let node = match spec.node {
        Some(Pick::At(n)) if n >= at.nodes => {
            return Err(format!("node={n}, but the job has {} node(s)", at.nodes))
        }
        Some(Pick::At(n)) => Some(n),
        Some(Pick::Random) => Some(choose(node_draw, at.nodes)),
        None if spec.kind == Kind::NodeLoss => Some(choose(node_draw, at.nodes)),
        None => None,
    };
    if spec.kind == Kind::NodeLoss {
        if node != Some(at.node) {
            return Ok(None);
        }
        let pids = at.local.iter().map(|t| t.pid).collect();
        return Ok(Some((None, Act::EndNode { pids })));
    }
    let target = match (spec.rank, node) {
        (Some(Pick::At(r)), _) if r >= at.world_size => {
            return Err(format!(
                "rank={r}, but the job has {} rank(s)",
                at.world_size
            ))
        }
        (Some(Pick::At(r)), _) => at.local.iter().find(|t| t.rank == r).copied(),
        // A random rank of the chosen node: only that node knows its ranks.
        (_, Some(n)) if n != at.node => return Ok(None),
        (_, Some(_)) => Some(at.local[choose(rank_draw, at.local.len())]),
        (_, None) => {
            let rank = choose(rank_draw, at.world_size);
            at.local.iter().find(|t| t.rank == rank).copied()
        }
    };
    let Some(t) = target else {
        return Ok(None);
    };
    let act = match spec.kind {
        Kind::Kill => Act::Signal {
            pid: t.pid,
            signal: libc::SIGKILL,
        },
        Kind::Hang => Act::Signal {
            pid: t.pid,
            signal: libc::SIGSTOP,
        },
        Kind::Slow => Act::Throttle {
            pid: t.pid,
            pct: spec.slow_cpu_pct,
            secs: spec.slow_for.as_secs_f64(),
        },
        Kind::NodeLoss => unreachable!("handled above"),
    };
    Ok(Some((Some(t), act)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::chaos::parse;

    fn layout(node: usize, nodes: usize, per: usize) -> Layout {
        Layout {
            node,
            nodes,
            world_size: nodes * per,
            local: (0..per)
                .map(|l| Target {
                    rank: node * per + l,
                    pid: 1000 + (node * per + l) as i32,
                })
                .collect(),
        }
    }

    fn spec(text: &str) -> FaultSpec {
        parse(text).unwrap().faults.remove(0)
    }

    #[test]
    fn a_named_rank_lands_on_its_node_only() {
        let s = spec("kill:after=1s,rank=3");
        assert_eq!(land(&s, 0, &layout(0, 2, 2)).unwrap(), None);
        let (t, act) = land(&s, 0, &layout(1, 2, 2)).unwrap().unwrap();
        assert_eq!(t, Some(Target { rank: 3, pid: 1003 }));
        assert_eq!(
            act,
            Act::Signal {
                pid: 1003,
                signal: libc::SIGKILL
            }
        );
        let e = land(&spec("kill:after=1s,rank=9"), 0, &layout(0, 2, 2)).unwrap_err();
        assert!(e.contains("rank=9") && e.contains("4 rank(s)"), "{e}");
        let (_, act) = land(&spec("hang:after=1s,rank=0"), 0, &layout(0, 1, 2))
            .unwrap()
            .unwrap();
        assert_eq!(
            act,
            Act::Signal {
                pid: 1000,
                signal: libc::SIGSTOP
            }
        );
    }

    #[test]
    fn a_random_rank_is_the_same_choice_on_every_node() {
        let s = spec("kill:after=1s");
        for draw in [0u64, 7, 123_456_789, u64::MAX] {
            let landed: Vec<_> = (0..3)
                .filter_map(|n| land(&s, draw, &layout(n, 3, 4)).unwrap())
                .collect();
            assert_eq!(landed.len(), 1, "exactly one node injects (draw {draw})");
        }
    }

    #[test]
    fn node_loss_ends_the_chosen_node() {
        let s = spec("node-loss:after=1s,node=1");
        assert_eq!(land(&s, 0, &layout(0, 2, 2)).unwrap(), None);
        let (t, act) = land(&s, 0, &layout(1, 2, 2)).unwrap().unwrap();
        assert_eq!(t, None);
        assert_eq!(
            act,
            Act::EndNode {
                pids: vec![1002, 1003]
            }
        );
        let e = land(&spec("node-loss:after=1s,node=5"), 0, &layout(0, 2, 2)).unwrap_err();
        assert!(e.contains("node=5"), "{e}");
        let (_, act) = land(
            &spec("slow:after=1s,node=0,for=2s,cpu=5"),
            3,
            &layout(0, 2, 2),
        )
        .unwrap()
        .unwrap();
        assert!(
            matches!(act, Act::Throttle { pct, .. } if pct == 5.0),
            "{act:?}"
        );
    }
}
