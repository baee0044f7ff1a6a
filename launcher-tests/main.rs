//! The one integration-test binary. Each module drives the real `rdrun` binary (or the library's
//! public API over real sockets) with a hard wall-clock bound on every run.
//!
//! - `util`: the `Rdrun` runner builder, temp dirs, hard timeouts, process-leak checks.
//! - `cli`, `env`, `restart`, `signals`, `output`, `report`: the launcher (single node).
//! - `console`: closed, full and slow consoles never panic rdrun; the console stress probe (many
//!   ranks, a slow reader: every line whole, once, in order).
//! - `store`: the TCPStore-compatible server and client over 127.0.0.1.
//! - `runtime`, `train`: the worker runtime's collectives and the `train` demo under rdrun.
//! - `netns`: the network-namespace hosts every multi-node test uses, and their own checks.
//! - `rendezvous`: multi-node rendezvous on loopback and in network namespaces.
//! - `multinode`: several real `rdrun` agents forming one job (static, c10d; loopback, netns).
//! - `static_restart`: restarts of a static two-node PyTorch DDP job on loopback (issue 24.1).
//! - `slurm`: a real Slurm 22.05 cluster (munged, slurmctld, a slurmd per network namespace):
//!   srun, salloc and sbatch launches of rdrun with no flag beyond the program.
//! - `cluster`: scheduler environments (a Slurm step, in place too; pods and LSF hosts in network
//!   namespaces) with no flag: one world, the topology banner, `--dry-run`, refusals.
//! - `schedenv`: what a user sees of a scheduler environment (issue 25): the `PET_*` quirks,
//!   one MPI rank, a node count against a fixed node set, LSF slots, what `--dry-run` adds.
//! - `mpi`: in-place mode under a real Open MPI (`mpirun -np 4 rdrun script`, gloo all_reduce),
//!   and node identity from the hostnames the ranks exchange.
//! - `etcd` (feature `etcd`): the etcd v3 rendezvous against a real etcd cluster, nodes and
//!   members in network namespaces (on loopback where none can be made).
//! - `addr`: MASTER_ADDR as given, where stores listen, endpoint ports and names.
//! - `contain`: nothing a worker starts outlives rdrun's death (cgroup, watchdog, segments).
//! - `health_contain`: what a health check's program starts ends with the check, and a check
//!   running when rdrun is SIGKILLed dies with it (issue 38.11).
//! - `hang`: hang detection wired into the agent, with small budgets.
//! - `health`: node health checks before a node joins (issue 28): a static job with a bad node
//!   fails fast naming it (exit 75), warn only warns, check time bounds, an elastic node stays out;
//!   `health_outside`: and ends as soon as the job it stayed out of does (c10d, etcd).
//! - `verdict`: the stop verdict for a failure repeated attempt after attempt (exit 93).
//! - `observe`: lifecycle events, the health endpoint, `/metrics`, the waiting status line.
//! - `observe_http`: `/metrics` by `Accept` (both Python parsers), HEAD, the health port on IPv6.
//! - `compat`: torchrun features that are "same" or "improved" (issue 15): NUMA/CPU binding of
//!   real workers over fake sysfs trees, completion scripts in the real shells, the man page.
//! - `completion`: every flag's completion typed at a terminal (tmux) in bash, zsh and fish.
//! - `scale`: small-size smokes of the scale benchmarks (store start-up storm), no timings.
//! - `collapse`: `--output collapse` on 8 ranks (shared lines once, logs per rank byte-exact).
//! - `progress`: `--progress`: real tqdm bars on 4 ranks, one live line at a tmux terminal, one
//!   line per interval on a pipe, logs byte-exact.
//! - `debugrank`: `--debug-rank`: debugpy listening on one rank (a DAP handshake), the attach
//!   hint without debugpy, the rank's pauses not a hang.
//! - `rankctl`: per-rank control (issue 29): `--wrap` on chosen ranks (a recording wrapper,
//!   strace), `--stdin` to one rank (piped, and pdb at a tmux terminal).
//! - `warm`: warm starts (workers forked from the template interpreter) with real PyTorch:
//!   what a worker sees, restarts, fallbacks to cold, containment; `warm_io`: their output
//!   bursts, a terminal prompt with `--stdin 0`, `torch.multiprocessing` spawn, import output.
//! - `netcheck`: the network pre-check across namespace hosts (one rate-limited with `tc tbf`)
//!   and `--max-node-failures` (issue 28 items 3 and 4); `netcheck_etcd`: the same on the etcd
//!   backend (the exchange through etcd keys), against the real etcd of `etcd`; `delayline`: a
//!   user-space delay line on one namespace host's link (TAP devices), for kernels without netem.
//! - `regression`: one test per fixed bug or torchrun misbehaviour, named after it.
//! - `chaos`: `--chaos` (issue 41): an injected kill and hang in a real gloo DDP job with
//!   checkpoints (restart, resume, the table, the report's section, the events), injected
//!   failures outside the stop verdict, work lost, a fault not survived, the seeded schedule.
//! - `ci`: a failing DDP job under a fake GitHub Actions environment: the annotation, the step
//!   summary and `--report-junit`'s XML read back (issue 40); `helpscreen`: `--help`'s sections,
//!   enum values and exit statuses, `--version`.

mod addr;
mod chaos;
mod ci;
mod cli;
mod cluster;
mod collapse;
mod compat;
mod completion;
mod console;
mod contain;
mod debugrank;
mod delayline;
mod env;
#[cfg(feature = "etcd")]
mod etcd;
mod hang;
mod health;
mod health_contain;
mod health_outside;
mod helpscreen;
mod mpi;
mod multinode;
mod netcheck;
#[cfg(feature = "etcd")]
mod netcheck_etcd;
mod netns;
mod observe;
mod observe_http;
mod output;
mod progress;
mod rankctl;
mod regression;
mod rendezvous;
mod report;
mod restart;
mod runtime;
mod scale;
mod schedenv;
mod signals;
mod slurm;
mod static_restart;
mod store;
mod term;
#[cfg(feature = "train")]
mod train;
mod util;
mod verdict;
mod warm;
mod warm_io;
mod warm_learn;
