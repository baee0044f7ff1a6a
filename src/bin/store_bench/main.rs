//! `rdrun-store-bench`: load generator for TCPStore-compatible servers (rdrun's or PyTorch's), and a
//! way to run rdrun's store server on its own. Used by `scripts/bench-store.sh`; every mode is
//! bounded in time and prints one `key=value` result line per measurement on stdout.
//!
//! Modes:
//! - `serve`: run rdrun's store server on `--host`/`--port` (0 = any), print `port=N`, serve until
//!   killed (SIGINT shuts down cleanly, exit 0; a server that stopped by itself exits 1). The store
//!   tests run it under a lowered descriptor limit and read its warnings.
//! - `load`: for each pipeline depth in `--depth` and count in `--conns` (e.g. `1,64,1024`), that
//!   many raw connections of one pool per server in `--ports` each loop SET, GET, ADD (depth
//!   triples per write, answers checked) for `--secs`, servers interleaved, `--rounds` times;
//!   prints `req_per_s` per phase, round and server.
//! - `herd`: `--clients` clients each connect (VALIDATE + PING), ADD a counter and WAIT on a key
//!   the last arrival sets; prints `wall_s`.
//! - `startup`: PyTorch's start-up pattern for `--clients` ranks (connect + VALIDATE, the `init/`
//!   ADD, each rank's own SET, rank 0's shared SET that everyone GETs, an ADD + WAIT barrier),
//!   spread over `--procs` generator processes (children of this binary, `startup-part`, each on
//!   its own loopback source address: one process may hold only so many descriptors); prints
//!   when the last rank finished each phase, the slowest client per phase, connection retries,
//!   the worst latency of a fresh client probing every `--probe-ms`, and with `--server-pid`
//!   the server's CPU time and RSS (issue 16).
//! - `idle`: open `--conns` validated connections, print `ready=N`, hold them until stdin closes or
//!   `--hold-secs` passed.
//!
//! The binary is split by job: this file holds the arguments and the dispatch; `modes.rs` the
//! single-process patterns (`serve`, `load`, `herd`, `idle`); `startup.rs` the start-up storm over
//! several generator processes.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rdrun::store::server::{raise_nofile_limit, ServerConfig};

mod modes;
mod startup;

use modes::{herd, idle, load, serve};
use startup::{startup, startup_child};

#[derive(Parser)]
#[command(
    name = "rdrun-store-bench",
    about = "TCPStore load generator and standalone server"
)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Run rdrun's store server.
    Serve {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Tokio worker threads; 0 = a current-thread runtime (as the launcher may use).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Scheduler ticks between looks at the runtime's global queue, where the accept
        /// thread puts new connections (tokio's default is 31; the launcher uses
        /// `STORE_GLOBAL_QUEUE_INTERVAL`, new connections first).
        #[arg(long, default_value_t = rdrun::store::server::STORE_GLOBAL_QUEUE_INTERVAL)]
        global_queue_interval: u32,
        /// Close connections that have not sent VALIDATE this long after connecting.
        #[arg(long)]
        validate_timeout_secs: Option<f64>,
        /// At most one warning line per kind per this many seconds.
        #[arg(long)]
        log_interval_secs: Option<f64>,
    },
    /// SET/GET/ADD mix over N connections.
    Load {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Comma-separated server ports; phases alternate between them.
        #[arg(long, value_delimiter = ',')]
        ports: Vec<u16>,
        /// Comma-separated connection counts; one phase each, on one pool of connections.
        #[arg(long, default_value = "1", value_delimiter = ',')]
        conns: Vec<usize>,
        /// Seconds per phase.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Comma-separated pipeline depths (SET+GET+ADD triples per write); 1 = one request
        /// waits for its answer, as PyTorch's client does.
        #[arg(long, default_value = "1", value_delimiter = ',')]
        depth: Vec<usize>,
        /// Rounds per phase and server (report the best).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Key namespace, so that runs against one server do not collide.
        #[arg(long, default_value = "load")]
        tag: String,
    },
    /// Connect storm + ADD + WAIT barrier.
    Herd {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 4096)]
        clients: usize,
        #[arg(long, default_value_t = 120.0)]
        timeout_secs: f64,
        #[arg(long, default_value = "herd")]
        tag: String,
    },
    /// PyTorch's start-up pattern for N ranks.
    Startup {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 4096)]
        clients: usize,
        /// Generator processes (0 = one per 8,000 clients).
        #[arg(long, default_value_t = 0)]
        procs: usize,
        #[arg(long, default_value_t = 120.0)]
        timeout_secs: f64,
        #[arg(long, default_value = "startup")]
        tag: String,
        /// The server's pid: report its CPU time and RSS.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Fresh-client probe period.
        #[arg(long, default_value_t = 10)]
        probe_ms: u64,
        /// Run every generator share in a child process at this nice value (1-19), this
        /// process only coordinating and probing at normal priority: on one machine, the
        /// clients' CPU then yields to the server's, as if they ran on other hosts.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
        gen_nice: i32,
    },
    /// One generator process of `startup` (started by it).
    #[command(hide = true)]
    StartupPart {
        #[arg(long)]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        source: Option<std::net::IpAddr>,
        #[arg(long)]
        first: usize,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        world: usize,
        #[arg(long)]
        tag: String,
        #[arg(long)]
        timeout_secs: f64,
    },
    /// Hold N idle validated connections.
    Idle {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 10_000)]
        conns: usize,
        #[arg(long, default_value_t = 120.0)]
        hold_secs: f64,
        /// Stop opening connections after this long (report how many are open).
        #[arg(long, default_value_t = 60.0)]
        connect_secs: f64,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RDRUN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = raise_nofile_limit() {
        eprintln!("rdrun-store-bench: warning: could not raise the open-file limit: {e}");
    }
    let rt = match &args.mode {
        Mode::Serve {
            threads: 0,
            global_queue_interval,
            ..
        } => tokio::runtime::Builder::new_current_thread()
            .global_queue_interval((*global_queue_interval).max(1))
            .enable_all()
            .build(),
        Mode::Serve {
            threads,
            global_queue_interval,
            ..
        } => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(*threads)
            .global_queue_interval((*global_queue_interval).max(1))
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdrun-store-bench: error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args.mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdrun-store-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Runs the chosen mode. Long only because it is one arm per subcommand, each just unpacking
/// its flags into its mode's function: split per arm it would move the unpacking, not the work.
async fn run(mode: Mode) -> Res {
    match mode {
        Mode::Serve {
            host,
            port,
            validate_timeout_secs,
            log_interval_secs,
            ..
        } => {
            let mut config = ServerConfig::default();
            if let Some(s) = validate_timeout_secs {
                config.validate_timeout = Duration::try_from_secs_f64(s)?;
            }
            if let Some(s) = log_interval_secs {
                config.log_interval = Duration::try_from_secs_f64(s)?;
            }
            serve(&host, port, config).await
        }
        Mode::Load {
            host,
            ports,
            conns,
            depth,
            secs,
            rounds,
            tag,
        } => {
            load(
                &host,
                ports,
                conns,
                depth,
                Duration::from_secs_f64(secs),
                rounds,
                &tag,
            )
            .await
        }
        Mode::Herd {
            host,
            port,
            clients,
            timeout_secs,
            tag,
        } => {
            herd(
                &host,
                port,
                clients,
                Duration::from_secs_f64(timeout_secs),
                &tag,
            )
            .await
        }
        Mode::Startup {
            host,
            port,
            clients,
            procs,
            timeout_secs,
            tag,
            server_pid,
            probe_ms,
            gen_nice,
        } => {
            let procs = if procs == 0 {
                clients.div_ceil(8000)
            } else {
                procs
            };
            startup(
                &host,
                port,
                clients,
                procs,
                Duration::try_from_secs_f64(timeout_secs)?,
                &tag,
                server_pid,
                Duration::from_millis(probe_ms),
                gen_nice,
            )
            .await
        }
        Mode::StartupPart {
            host,
            port,
            source,
            first,
            count,
            world,
            tag,
            timeout_secs,
        } => {
            startup_child(
                &host,
                port,
                source,
                first,
                count,
                world,
                &tag,
                Duration::try_from_secs_f64(timeout_secs)?,
            )
            .await
        }
        Mode::Idle {
            host,
            port,
            conns,
            hold_secs,
            connect_secs,
        } => {
            idle(
                &host,
                port,
                conns,
                Duration::from_secs_f64(hold_secs),
                Duration::from_secs_f64(connect_secs),
            )
            .await
        }
    }
}

/// Resolves when stdin reaches EOF (the parent closed it or exited).
pub(crate) async fn stdin_closed() {
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
