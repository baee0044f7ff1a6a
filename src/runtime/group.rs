//! The process group: joins the other ranks through the store, picks a backend, and offers typed
//! collectives on host slices.
//!
//! Setup (spec runtime.md §6): every key lives under `rdrun/<run_id>/<restart>/<tag>/` so a
//! restarted group never reads a previous round's keys. Each rank binds a TCP listener, publishes
//! `addr/<rank>` = `ip:port` and its host identity (hostname + boot id, as NCCL's host hash), and
//! reads everyone else's. `auto` picks shared memory when all ranks share one host, shared memory
//! inside hosts + TCP between host leaders when some host has several ranks, TCP otherwise
//! ([`choose_backend`]), and also brings up an NCCL communicator when every rank can
//! ([`nccl_decision`]). The group finishes setup with a backend barrier, so a returned group is
//! fully connected. Options and the store connection come from [`super::bootstrap`].
//!
//! Errors poison the group: after the first failure every call returns
//! [`RuntimeError::Poisoned`] (the sockets or slots may be mid-message), and the caller is expected
//! to exit so the launcher restarts the round.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::sync::Mutex;
use std::time::Duration;

use super::backend::Backend;
use super::bootstrap::{store_from_env, BackendChoice, GroupOptions};
use super::elem::{Element, ReduceOp};
use super::error::{Result, RuntimeError};
use super::groupstore::{GroupStore, StoreFailure};
use super::shm::{unique_segment_path, ShmComm, ShmSetup};
use super::tcp::TcpMesh;

struct State {
    backend: Box<dyn Backend>,
    poisoned: Option<String>,
}

/// A joined group of ranks. `Send + Sync`; calls are serialized internally, so share it with an
/// `Arc` (the DDP reducer's communication thread does).
pub struct ProcessGroup {
    rank: usize,
    world: usize,
    backend_name: &'static str,
    hosts: Vec<String>,
    state: Mutex<State>,
    #[cfg(feature = "nccl")]
    nccl: Option<std::sync::Arc<super::nccl::NcclGroup>>,
}

/// This machine's identity: hostname plus kernel boot id (two containers sharing a hostname but
/// not a kernel, or a rebooted host, are told apart — the same key NCCL's host hash uses).
pub fn host_identity() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

/// The local IP other ranks can reach, judged by the route to the store host (no packet is
/// sent: connecting a UDP socket only selects a route).
pub fn advertise_ip_for(master_addr: &str, master_port: u16) -> IpAddr {
    let target = (master_addr, master_port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next());
    match target {
        Some(t) if t.ip().is_loopback() => t.ip(),
        Some(t) => {
            let bind: SocketAddr = if t.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            UdpSocket::bind(bind)
                .and_then(|s| {
                    s.connect(t)?;
                    s.local_addr()
                })
                .map(|a| a.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        }
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

/// Decides the backend from the choice and every rank's host identity: one host → shared
/// memory; several hosts, one of them with several ranks → hierarchical; one rank per host → TCP.
pub fn choose_backend(choice: BackendChoice, hosts: &[String]) -> BackendChoice {
    match choice {
        BackendChoice::Auto => {
            let topo = super::hier::Topology::from_hosts(hosts);
            if topo.nodes.len() == 1 {
                BackendChoice::Shm
            } else if topo.nodes.iter().any(|n| n.len() > 1) {
                BackendChoice::Hier
            } else {
                BackendChoice::Tcp
            }
        }
        c => c,
    }
}

/// Whether the group brings up NCCL, from the choice and every rank's probe (published with its
/// address): forced `Nccl` needs it on every rank and names the ranks without it; `Auto` uses it
/// only when every rank has it (a group is all-NCCL or not at all: NCCL collectives need every
/// rank); the host backends never do.
pub fn nccl_decision(
    choice: BackendChoice,
    auto_nccl: bool,
    have: &[bool],
) -> std::result::Result<bool, Vec<usize>> {
    let all = !have.is_empty() && have.iter().all(|h| *h);
    match choice {
        BackendChoice::Nccl if all => Ok(true),
        BackendChoice::Nccl => Err(have
            .iter()
            .enumerate()
            .filter(|(_, h)| !**h)
            .map(|(r, _)| r)
            .collect()),
        BackendChoice::Auto => Ok(auto_nccl && all),
        _ => Ok(false),
    }
}

/// Can this rank run NCCL? The CUDA device it would use, or why not (no `nccl` feature, no
/// driver, no libnccl, no device for its local rank). Never panics.
#[cfg(feature = "nccl")]
fn nccl_probe(opts: &GroupOptions) -> std::result::Result<usize, String> {
    super::nccl::probe_device(opts.rank, opts.local_rank)
}

#[cfg(not(feature = "nccl"))]
fn nccl_probe(_opts: &GroupOptions) -> std::result::Result<usize, String> {
    Err("this build has no NCCL support (cargo feature `nccl`)".into())
}

fn store_err(rank: usize, op: &'static str, e: StoreFailure) -> RuntimeError {
    match e {
        StoreFailure::Timeout(after, key) => RuntimeError::Timeout {
            rank,
            op,
            after,
            waiting_for: format!("store key {key:?}"),
        },
        StoreFailure::Other(msg) => RuntimeError::Store { rank, op, msg },
    }
}

struct StoreShmSetup<'a> {
    store: &'a dyn GroupStore,
    prefix: String,
    /// Global rank, for error messages.
    rank: usize,
    world: usize,
    timeout: Duration,
}

impl ShmSetup for StoreShmSetup<'_> {
    fn announce_created(&self, path: &std::path::Path) -> Result<()> {
        self.store
            .set(
                &format!("{}shm/created", self.prefix),
                path.to_string_lossy().as_bytes(),
            )
            .map_err(|e| store_err(self.rank, "init", e))
    }
    fn wait_created(&self) -> Result<std::path::PathBuf> {
        self.store
            .get_wait(&format!("{}shm/created", self.prefix), self.timeout)
            .map(|v| std::path::PathBuf::from(String::from_utf8_lossy(&v).into_owned()))
            .map_err(|e| store_err(self.rank, "init", e))
    }
    fn all_mapped(&self) -> Result<()> {
        let n = self
            .store
            .add(&format!("{}shm/mapped", self.prefix), 1)
            .map_err(|e| store_err(self.rank, "init", e))?;
        if n as usize == self.world {
            self.store
                .set(&format!("{}shm/ready", self.prefix), b"1")
                .map_err(|e| store_err(self.rank, "init", e))?;
        }
        self.store
            .get_wait(&format!("{}shm/ready", self.prefix), self.timeout)
            .map(|_| ())
            .map_err(|e| store_err(self.rank, "init", e))
    }
}

/// What every rank published at init: its listener address, host and whether it can use NCCL.
struct Peers {
    addrs: Vec<SocketAddr>,
    hosts: Vec<String>,
    have_nccl: Vec<bool>,
}

/// One rank's join in progress: the store, the options, and the group's key prefix.
struct Joining<'a> {
    store: &'a dyn GroupStore,
    opts: &'a GroupOptions,
    prefix: String,
    rank: usize,
    world: usize,
}

impl Joining<'_> {
    /// A listener on the advertised address (port chosen by the kernel) and its address.
    fn listen(&self) -> Result<(TcpListener, SocketAddr)> {
        let (rank, op) = (self.rank, "init");
        let ip = self
            .opts
            .advertise_ip
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = TcpListener::bind((ip, 0)).map_err(|e| RuntimeError::Io {
            rank,
            op,
            msg: format!("bind a listener on {ip}: {e}"),
        })?;
        let me = listener.local_addr().map_err(|e| RuntimeError::Io {
            rank,
            op,
            msg: format!("listener address: {e}"),
        })?;
        Ok((listener, me))
    }

    /// Publishes this rank's line (`addr\nhost\nnccl`) and reads every rank's.
    fn exchange(&self, me: SocketAddr, host: &str, nccl_ok: bool) -> Result<Peers> {
        let (rank, op, prefix) = (self.rank, "init", &self.prefix);
        self.store
            .set(
                &format!("{prefix}addr/{rank}"),
                format!("{me}\n{host}\n{}", u8::from(nccl_ok)).as_bytes(),
            )
            .map_err(|e| store_err(rank, op, e))?;
        let mut peers = Peers {
            addrs: Vec::with_capacity(self.world),
            hosts: Vec::with_capacity(self.world),
            have_nccl: Vec::with_capacity(self.world),
        };
        for j in 0..self.world {
            let v = self
                .store
                .get_wait(&format!("{prefix}addr/{j}"), self.opts.timeout)
                .map_err(|e| store_err(rank, op, e))?;
            let text = String::from_utf8_lossy(&v).into_owned();
            let mut fields = text.split('\n');
            let a = fields.next().unwrap_or("");
            let h = fields.next().unwrap_or("");
            peers.have_nccl.push(fields.next() == Some("1"));
            let addr: SocketAddr = a.parse().map_err(|_| RuntimeError::Store {
                rank,
                op,
                msg: format!("rank {j} published a bad address {a:?}"),
            })?;
            peers.addrs.push(addr);
            peers.hosts.push(h.to_string());
        }
        Ok(peers)
    }

    /// The shared-memory transport of the ranks on one host (all of them).
    fn shm(&self, hosts: &[String]) -> Result<Box<dyn Backend>> {
        let (rank, world, opts) = (self.rank, self.world, self.opts);
        if hosts.iter().any(|h| *h != hosts[0]) {
            return Err(RuntimeError::Unavailable {
                rank,
                op: "init",
                backend: "shm".into(),
                why: "ranks are on different hosts".into(),
            });
        }
        let setup = StoreShmSetup {
            store: self.store,
            prefix: self.prefix.clone(),
            rank,
            world,
            timeout: opts.timeout,
        };
        let path = unique_segment_path(&opts.run_id, opts.restart_count, &self.prefix);
        Ok(Box::new(ShmComm::open(
            rank,
            world,
            &path,
            opts.shm_slot_bytes,
            opts.timeout,
            &setup,
        )?))
    }

    /// Hierarchical: shared memory within each host, a TCP mesh between the hosts' leaders.
    fn hier(&self, peers: &Peers, listener: TcpListener) -> Result<Box<dyn Backend>> {
        let (rank, opts, prefix) = (self.rank, self.opts, &self.prefix);
        let topo = super::hier::Topology::from_hosts(&peers.hosts);
        let (node, li) = topo.place[rank];
        let local_n = topo.nodes[node].len();
        let local_prefix = format!("{prefix}host{node}/");
        let setup = StoreShmSetup {
            store: self.store,
            prefix: local_prefix.clone(),
            rank,
            world: local_n,
            timeout: opts.timeout,
        };
        let path = unique_segment_path(&opts.run_id, opts.restart_count, &local_prefix);
        let local = ShmComm::open(
            li,
            local_n,
            &path,
            opts.shm_slot_bytes,
            opts.timeout,
            &setup,
        )?;
        let leaders = if li == 0 {
            let leader_addrs: Vec<SocketAddr> =
                topo.nodes.iter().map(|n| peers.addrs[n[0]]).collect();
            Some(TcpMesh::connect(
                node,
                topo.nodes.len(),
                listener,
                &leader_addrs,
                super::shm::fnv1a(format!("{prefix}leaders").as_bytes()),
                opts.timeout,
            )?)
        } else {
            drop(listener);
            None
        };
        Ok(Box::new(super::hier::HierComm::new(
            rank, topo, local, leaders,
        )))
    }
}

impl ProcessGroup {
    /// Joins the group described by `opts` through `store` (blocking, bounded by `opts.timeout`).
    pub fn new(store: &dyn GroupStore, opts: &GroupOptions) -> Result<Self> {
        let (rank, world) = (opts.rank, opts.world_size);
        let op = "init";
        if world == 0 || rank >= world {
            return Err(RuntimeError::Invalid {
                rank,
                op,
                msg: format!("rank {rank} is outside world size {world}"),
            });
        }
        let joining = Joining {
            store,
            opts,
            prefix: format!("rdrun/{}/{}/{}/", opts.run_id, opts.restart_count, opts.tag),
            rank,
            world,
        };
        let host = opts.host_id.clone().unwrap_or_else(host_identity);
        let (listener, me) = joining.listen()?;
        // Only the choices that may use NCCL probe for it (the probe loads libcuda).
        let probe = match opts.backend {
            BackendChoice::Nccl => nccl_probe(opts),
            BackendChoice::Auto if opts.auto_nccl => nccl_probe(opts),
            _ => Err("not asked for".into()),
        };
        if let Err(why) = &probe {
            tracing::debug!(rank, "no NCCL for this group: {why}");
        }
        let peers = joining.exchange(me, &host, probe.is_ok())?;
        let use_nccl =
            nccl_decision(opts.backend, opts.auto_nccl, &peers.have_nccl).map_err(|ranks| {
                RuntimeError::Unavailable {
                    rank,
                    op,
                    backend: "nccl".into(),
                    why: match &probe {
                        Err(why) if ranks.contains(&rank) => why.clone(),
                        _ => format!("rank(s) {ranks:?} cannot use NCCL"),
                    },
                }
            })?;
        #[cfg(feature = "nccl")]
        let nccl = match (use_nccl, &probe) {
            (true, Ok(ordinal)) => Some(std::sync::Arc::new(super::nccl::NcclGroup::new(
                store,
                &format!("{}nccl/", joining.prefix),
                rank,
                world,
                *ordinal,
                opts.timeout,
            )?)),
            _ => None,
        };
        #[cfg(not(feature = "nccl"))]
        let _ = use_nccl;
        let backend: Box<dyn Backend> = match choose_backend(opts.backend, &peers.hosts) {
            #[cfg(feature = "nccl")]
            BackendChoice::Nccl => {
                drop(listener);
                Box::new(super::nccl::NcclBackend::new(
                    nccl.clone()
                        .expect("invariant: nccl_decision said every rank has NCCL"),
                ))
            }
            BackendChoice::Shm => {
                drop(listener);
                joining.shm(&peers.hosts)?
            }
            BackendChoice::Hier => joining.hier(&peers, listener)?,
            _ => Box::new(TcpMesh::connect(
                rank,
                world,
                listener,
                &peers.addrs,
                super::shm::fnv1a(joining.prefix.as_bytes()),
                opts.timeout,
            )?),
        };
        let pg = ProcessGroup {
            rank,
            world,
            backend_name: backend.name(),
            hosts: peers.hosts,
            state: Mutex::new(State {
                backend,
                poisoned: None,
            }),
            #[cfg(feature = "nccl")]
            nccl,
        };
        pg.barrier()?;
        tracing::debug!(
            rank,
            world,
            backend = pg.backend_name,
            "process group ready"
        );
        Ok(pg)
    }

    /// Joins using the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    /// TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, RDRUN_BACKEND, RDRUN_TIMEOUT_SECS) and
    /// a given store connection.
    pub fn init_with_store(store: &dyn GroupStore) -> Result<Self> {
        let (env, mut opts) = GroupOptions::from_process_env()?;
        opts.advertise_ip = Some(advertise_ip_for(&env.master_addr, env.master_port));
        Self::new(store, &opts)
    }

    /// Joins using the launcher's environment: the TCP store at MASTER_ADDR:MASTER_PORT, or the
    /// directory store named by `RDRUN_FILE_STORE` when that is set.
    pub fn init_from_env() -> Result<Self> {
        let (env, opts) = GroupOptions::from_process_env()?;
        let store = store_from_env(&env, opts.timeout)?;
        Self::init_with_store(store.as_ref())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world_size(&self) -> usize {
        self.world
    }
    /// The backend of host-slice collectives: "tcp", "shm", "hier" or "nccl".
    pub fn backend_name(&self) -> &'static str {
        self.backend_name
    }

    /// The NCCL communicator for device buffers, when this group has one (`Auto` on ranks that
    /// all have a GPU and libnccl, or forced `Nccl`). Use [`super::nccl::NcclGroup::run`] for
    /// `CudaSlice` collectives on its stream.
    #[cfg(feature = "nccl")]
    pub fn nccl(&self) -> Option<&super::nccl::NcclGroup> {
        self.nccl.as_deref()
    }
    /// Host identity of every rank.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn run<F>(&self, op: &'static str, f: F) -> Result<()>
    where
        F: FnOnce(&mut dyn Backend) -> Result<()>,
    {
        let mut st = self.state.lock().map_err(|_| RuntimeError::Poisoned {
            rank: self.rank,
            op,
            first: "a thread panicked inside a collective".into(),
        })?;
        if let Some(first) = &st.poisoned {
            return Err(RuntimeError::Poisoned {
                rank: self.rank,
                op,
                first: first.clone(),
            });
        }
        let res = f(st.backend.as_mut());
        if let Err(e) = &res {
            st.poisoned = Some(e.to_string());
        }
        res
    }

    fn invalid(&self, op: &'static str, msg: String) -> RuntimeError {
        RuntimeError::Invalid {
            rank: self.rank,
            op,
            msg,
        }
    }

    /// In-place all-reduce; every rank ends with bit-identical values.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.run("all_reduce", |b| {
            b.all_reduce(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
        })
    }

    /// Copies `root`'s buffer to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        if root >= self.world {
            return Err(self.invalid(
                "broadcast",
                format!("root {root} is outside world size {}", self.world),
            ));
        }
        self.run("broadcast", |b| {
            b.broadcast(bytemuck::cast_slice_mut(buf), root)
        })
    }

    /// `recv` (world × `send.len()`) receives every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if recv.len() != send.len() * self.world {
            return Err(self.invalid(
                "all_gather",
                format!(
                    "recv has {} elements, expected {} (send {} x world {})",
                    recv.len(),
                    send.len() * self.world,
                    send.len(),
                    self.world
                ),
            ));
        }
        self.run("all_gather", |b| {
            b.all_gather(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
        })
    }

    /// Reduces `send` (world × `recv.len()`) and leaves this rank's block in `recv`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        if send.len() != recv.len() * self.world {
            return Err(self.invalid(
                "reduce_scatter",
                format!(
                    "send has {} elements, expected {} (recv {} x world {})",
                    send.len(),
                    recv.len() * self.world,
                    recv.len(),
                    self.world
                ),
            ));
        }
        self.run("reduce_scatter", |b| {
            b.reduce_scatter(
                bytemuck::cast_slice(send),
                bytemuck::cast_slice_mut(recv),
                T::DTYPE,
                op,
            )
        })
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.run("barrier", |b| b.barrier())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choice_table() {
        let same = vec!["a".to_string(), "a".to_string()];
        let mixed = vec!["a".to_string(), "b".to_string()];
        let cases = [
            (BackendChoice::Auto, &same, BackendChoice::Shm),
            (BackendChoice::Auto, &mixed, BackendChoice::Tcp),
            (BackendChoice::Tcp, &same, BackendChoice::Tcp),
            (BackendChoice::Shm, &mixed, BackendChoice::Shm),
            (BackendChoice::Hier, &same, BackendChoice::Hier),
        ];
        for (c, h, want) in cases {
            assert_eq!(choose_backend(c, h), want);
        }
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose_backend(BackendChoice::Auto, &h(&["a", "a", "b"])),
            BackendChoice::Hier
        );
        assert_eq!(
            choose_backend(BackendChoice::Auto, &h(&["a", "b", "c"])),
            BackendChoice::Tcp
        );
        assert_eq!("TCP".parse::<BackendChoice>(), Ok(BackendChoice::Tcp));
        assert_eq!("shm+tcp".parse::<BackendChoice>(), Ok(BackendChoice::Hier));
        assert!("nope".parse::<BackendChoice>().is_err());
    }

    #[test]
    fn nccl_decision_table() {
        use BackendChoice::*;
        let (yes, mixed, no) = (&[true, true][..], &[true, false, false][..], &[false][..]);
        assert_eq!(nccl_decision(Nccl, true, yes), Ok(true));
        assert_eq!(
            nccl_decision(Nccl, false, yes),
            Ok(true),
            "forced ignores auto_nccl"
        );
        assert_eq!(nccl_decision(Nccl, true, mixed), Err(vec![1, 2]));
        assert_eq!(nccl_decision(Nccl, true, &[]), Err(vec![]));
        assert_eq!(nccl_decision(Auto, true, yes), Ok(true));
        assert_eq!(nccl_decision(Auto, false, yes), Ok(false));
        assert_eq!(
            nccl_decision(Auto, true, mixed),
            Ok(false),
            "all or nothing"
        );
        assert_eq!(nccl_decision(Auto, true, no), Ok(false));
        for host in [Tcp, Shm, Hier] {
            assert_eq!(nccl_decision(host, true, yes), Ok(false));
        }
        assert_eq!("NCCL".parse::<BackendChoice>(), Ok(Nccl));
    }

    /// Without a usable NCCL (no feature, or no GPU/driver/libnccl on this machine) a forced
    /// `nccl` group is a clear error on every rank, and `auto` falls back to the host backends.
    #[test]
    fn nccl_unavailable_is_an_error_when_forced_and_skipped_by_auto() {
        let probe = nccl_probe(&GroupOptions::new(0, 1, "probe"));
        if probe.is_ok() {
            return; // a GPU machine: scripts/gpu-check.sh covers NCCL itself
        }
        let store = super::super::groupstore::MemStore::new();
        let results: Vec<Result<ProcessGroup>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let store = store.clone();
                    sc.spawn(move || {
                        let mut o = GroupOptions::new(r, 2, "forced-nccl");
                        o.backend = BackendChoice::Nccl;
                        o.timeout = Duration::from_secs(30);
                        ProcessGroup::new(&store, &o)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let why = probe.unwrap_err();
        for res in results {
            let e = res.err().expect("no NCCL here");
            assert!(
                matches!(&e, RuntimeError::Unavailable { backend, .. } if backend == "nccl"),
                "{e}"
            );
            assert!(e.to_string().contains(&why), "{e} / {why}");
        }
        #[cfg(not(feature = "nccl"))]
        assert!(why.contains("cargo feature `nccl`"), "{why}");
        let names = super::super::tests::run_world(
            2,
            BackendChoice::Auto,
            super::super::shm::DEFAULT_SLOT,
            Duration::from_secs(60),
            |pg| {
                #[cfg(feature = "nccl")]
                assert!(pg.nccl().is_none());
                pg.backend_name()
            },
        );
        assert_eq!(names, ["shm", "shm"]);
    }

    #[test]
    fn advertise_loopback() {
        assert!(advertise_ip_for("127.0.0.1", 1).is_loopback());
        assert!(advertise_ip_for("localhost", 1).is_loopback());
    }
}
