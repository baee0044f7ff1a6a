//! Hierarchical backend for several hosts with several ranks each: shared memory inside a host,
//! TCP between one leader per host (the local rank with the lowest global rank).
//!
//! all_reduce = shm all-reduce (Sum for Avg) → leaders' TCP all-reduce → shm broadcast from the
//! leader, then the Avg division on identical data; every rank ends bit-identical because each
//! stage is (shm: fixed rank order; TCP: owner-then-forward / commutative pairs) and the final
//! broadcast copies one leader's bytes. Broadcast, all-gather and barrier compose the same way;
//! reduce-scatter is an all-reduce followed by taking this rank's block.

use super::backend::Backend;
use super::elem::{div_bytes, DType, ReduceOp};
use super::error::{Result, RuntimeError};
use super::shm::ShmComm;
use super::tcp::TcpMesh;

/// How the world splits into hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Global ranks of each host, in rank order; hosts ordered by their lowest rank.
    pub nodes: Vec<Vec<usize>>,
    /// For every global rank: (node index, local index).
    pub place: Vec<(usize, usize)>,
}

impl Topology {
    /// Groups ranks by host identity.
    pub fn from_hosts(hosts: &[String]) -> Topology {
        let mut names: Vec<&String> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        let mut place = Vec::with_capacity(hosts.len());
        for (r, h) in hosts.iter().enumerate() {
            let k = match names.iter().position(|n| *n == h) {
                Some(k) => k,
                None => {
                    names.push(h);
                    nodes.push(Vec::new());
                    names.len() - 1
                }
            };
            place.push((k, nodes[k].len()));
            nodes[k].push(r);
        }
        Topology { nodes, place }
    }

    /// True when every host holds a contiguous block of ranks of one common size (torchrun's
    /// layout), which lets all-gather move whole host blocks.
    pub fn blocked(&self) -> bool {
        let l = self.nodes[0].len();
        let mut next = 0;
        self.nodes.iter().all(|n| {
            let ok = n.len() == l && n.iter().enumerate().all(|(i, r)| *r == next + i);
            next += n.len();
            ok
        })
    }
}

/// One rank's view of the hierarchical communicator.
pub struct HierComm {
    rank: usize,
    topo: Topology,
    local: ShmComm,
    /// Present on leaders only: the TCP mesh between hosts.
    leaders: Option<TcpMesh>,
}

impl HierComm {
    pub fn new(rank: usize, topo: Topology, local: ShmComm, leaders: Option<TcpMesh>) -> Self {
        HierComm {
            rank,
            topo,
            local,
            leaders,
        }
    }

    fn node(&self) -> usize {
        self.topo.place[self.rank].0
    }

    /// Rewrites a sub-communicator's ranks (local or leader indices) into global ranks.
    fn global(&self, e: RuntimeError, leader_level: bool) -> RuntimeError {
        let map = |i: usize| -> usize {
            if leader_level {
                self.topo.nodes.get(i).map(|n| n[0]).unwrap_or(i)
            } else {
                self.topo.nodes[self.node()].get(i).copied().unwrap_or(i)
            }
        };
        match e {
            RuntimeError::Peer { op, peer, msg, .. } => RuntimeError::Peer {
                rank: self.rank,
                op,
                peer: map(peer),
                msg,
            },
            RuntimeError::Timeout {
                op,
                after,
                waiting_for,
                ..
            } => RuntimeError::Timeout {
                rank: self.rank,
                op,
                after,
                waiting_for: format!(
                    "{waiting_for} ({} ranks)",
                    if leader_level { "host-leader" } else { "local" }
                ),
            },
            RuntimeError::Shm { op, msg, .. } => RuntimeError::Shm {
                rank: self.rank,
                op,
                msg,
            },
            RuntimeError::Io { op, msg, .. } => RuntimeError::Io {
                rank: self.rank,
                op,
                msg,
            },
            other => other,
        }
    }

    fn local_ar(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.local
            .all_reduce(buf, dtype, op)
            .map_err(|e| self.global(e, false))
    }
    fn local_bcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.local
            .broadcast(buf, root)
            .map_err(|e| self.global(e, false))
    }
    fn with_leaders<F>(&mut self, f: F) -> Result<()>
    where
        F: FnOnce(&mut TcpMesh) -> Result<()>,
    {
        let r = match self.leaders.as_mut() {
            Some(m) => f(m),
            None => return Ok(()),
        };
        r.map_err(|e| self.global(e, true))
    }
}

impl Backend for HierComm {
    fn name(&self) -> &'static str {
        "shm+tcp"
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let stage = if op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op
        };
        self.local_ar(buf, dtype, stage)?;
        self.with_leaders(|m| m.all_reduce(buf, dtype, stage))?;
        self.local_bcast(buf, 0)?;
        if op == ReduceOp::Avg {
            div_bytes(buf, dtype, self.topo.place.len());
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let (root_node, root_local) = self.topo.place[root];
        if self.node() == root_node {
            self.local_bcast(buf, root_local)?;
        }
        self.with_leaders(|m| m.broadcast(buf, root_node))?;
        if self.node() != root_node {
            self.local_bcast(buf, 0)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let l = send.len();
        if l == 0 {
            return Ok(());
        }
        if !self.topo.blocked() {
            // Irregular layouts: one broadcast per rank (correct, not fast).
            for r in 0..self.topo.place.len() {
                if r == self.rank {
                    recv[r * l..(r + 1) * l].copy_from_slice(send);
                }
                self.broadcast(&mut recv[r * l..(r + 1) * l], r)?;
            }
            return Ok(());
        }
        let per = self.topo.nodes[0].len();
        let node = self.node();
        let block = per * l;
        {
            let mine = &mut recv[node * block..(node + 1) * block];
            self.local
                .all_gather(send, mine)
                .map_err(|e| self.global(e, false))?;
        }
        if let Some(m) = self.leaders.as_mut() {
            let own = recv[node * block..(node + 1) * block].to_vec();
            let r = m.all_gather(&own, recv);
            if let Err(e) = r {
                return Err(self.global(e, true));
            }
        }
        self.local_bcast(recv, 0)
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let l = recv.len();
        let mut all = super::elem::AlignedBuf::new(send.len());
        all.as_mut_slice().copy_from_slice(send);
        self.all_reduce(all.as_mut_slice(), dtype, op)?;
        recv.copy_from_slice(&all.as_slice()[self.rank * l..(self.rank + 1) * l]);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        self.local.barrier().map_err(|e| self.global(e, false))?;
        self.with_leaders(|m| m.barrier())?;
        self.local.barrier().map_err(|e| self.global(e, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_table() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let t = Topology::from_hosts(&h(&["a", "a", "b", "b"]));
        assert_eq!(t.nodes, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(t.place, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert!(t.blocked());
        let t = Topology::from_hosts(&h(&["a", "b", "a", "b"]));
        assert_eq!(t.nodes, vec![vec![0, 2], vec![1, 3]]);
        assert!(!t.blocked());
        assert!(!Topology::from_hosts(&h(&["a", "a", "b"])).blocked());
    }
}
