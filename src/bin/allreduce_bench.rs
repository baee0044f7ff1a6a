//! `rdrun-allreduce-bench`: all-reduce latency and bus bandwidth of the runtime's backends,
//! printed in nccl-tests' columns (size, count, type, time, algbw, busbw; busbw = algbw ×
//! 2(n-1)/n, nccl-tests `doc/PERFORMANCE.md`).
//!
//! Under a launcher (RANK set) each process is one rank and joins through `init_from_env`.
//! Started by hand it launches `--nproc` copies of itself on this host with a directory store
//! (`RDRUN_FILE_STORE`), so it needs neither rdrun nor a TCP store. `--copy-ceiling` measures
//! this machine's memory-copy ceiling for the same sizes instead.

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use rdrun::runtime::{ProcessGroup, ReduceOp};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rdrun-allreduce-bench",
    about = "All-reduce latency and bus bandwidth"
)]
struct Args {
    /// Ranks to launch when not started by a launcher.
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// auto, tcp, shm (or nccl when built with the `nccl` feature).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Smallest message in bytes.
    #[arg(long, default_value_t = 4096)]
    min_bytes: usize,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_bytes: usize,
    /// Size step factor.
    #[arg(long, default_value_t = 4)]
    factor: usize,
    /// Scales the iteration counts (lower = quicker, noisier).
    #[arg(long, default_value_t = 1.0)]
    iters_scale: f64,
    /// Print one JSON object per size instead of a table.
    #[arg(long)]
    json: bool,
    /// With `--backend nccl` on one GPU: give each rank its own NCCL_HOSTID so NCCL treats the
    /// ranks as separate hosts (test-only; spec runtime.md §4.2).
    #[arg(long)]
    nccl_fake_hosts: bool,
    /// Instead of all-reducing: `--nproc` threads at once each copy their own buffer of each
    /// size (read the input once, write the output once: the least memory traffic one rank of
    /// any all-reduce needs), printed as the bus bandwidth an all-reduce would reach at that
    /// speed. A ceiling for the shared-memory backend on this machine.
    #[arg(long)]
    copy_ceiling: bool,
    /// Overall bound for a launch by hand.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

fn sizes(a: &Args) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = a.min_bytes.max(4);
    while s <= a.max_bytes {
        v.push(s);
        s *= a.factor.max(2);
    }
    v
}

fn iters_for(bytes: usize, scale: f64) -> usize {
    // About 64 MiB of traffic per size, between 5 and 2000 timed iterations.
    let base = ((64usize << 20) / bytes).clamp(5, 2000) as f64;
    ((base * scale) as usize).max(3)
}

fn worker(a: &Args) -> Result<(), String> {
    if a.backend == "nccl" {
        return nccl_worker(a);
    }
    if a.backend != "auto" {
        // The flag wins over an inherited RDRUN_BACKEND (set before any thread exists).
        std::env::set_var("RDRUN_BACKEND", &a.backend);
    }
    let pg = ProcessGroup::init_from_env().map_err(|e| e.to_string())?;
    let (n, r) = (pg.world_size(), pg.rank());
    if r == 0 && !a.json {
        println!(
            "# backend {} world {n}\n{:>12} {:>10} {:>6} {:>12} {:>10} {:>10}",
            pg.backend_name(),
            "size(B)",
            "count",
            "type",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)"
        );
    }
    for bytes in sizes(a) {
        let count = bytes / 4;
        let mut buf = vec![1.0f32; count];
        pg.all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        if buf.iter().any(|x| *x != n as f32) {
            return Err(format!("wrong all-reduce result at {bytes} bytes"));
        }
        buf.fill(0.0);
        let iters = iters_for(bytes, a.iters_scale);
        for _ in 0..2.min(iters) {
            pg.all_reduce(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
        }
        pg.barrier().map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        for _ in 0..iters {
            pg.all_reduce(&mut buf, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
        }
        let mut t = [t0.elapsed().as_secs_f64() / iters as f64];
        pg.all_reduce(&mut t, ReduceOp::Max)
            .map_err(|e| e.to_string())?;
        report(a, r, n, pg.backend_name(), bytes, count, t[0]);
    }
    Ok(())
}

fn report(a: &Args, rank: usize, n: usize, backend: &str, bytes: usize, count: usize, t: f64) {
    if rank != 0 {
        return;
    }
    let algbw = bytes as f64 / t / 1e9;
    let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
    if a.json {
        println!(
            "{{\"impl\":\"rdrun\",\"backend\":\"{backend}\",\"world\":{n},\"bytes\":{bytes},\"time_us\":{:.3},\"algbw\":{algbw:.4},\"busbw\":{busbw:.4}}}",
            t * 1e6
        );
    } else {
        println!(
            "{bytes:>12} {count:>10} {:>6} {:>12.2} {algbw:>10.3} {busbw:>10.3}",
            "float",
            t * 1e6
        );
    }
}

#[cfg(feature = "nccl")]
fn nccl_worker(a: &Args) -> Result<(), String> {
    use rdrun::runtime::nccl::NcclGroup;
    let g = NcclGroup::init_from_env().map_err(|e| e.to_string())?;
    let (n, r) = (g.world_size(), g.rank());
    // Correctness first: every op on f32 and a bf16 sum, against values computed here.
    let len = 1001;
    for (op, want) in [
        (ReduceOp::Sum, (0..n).map(|k| k as f32 + 1.0).sum::<f32>()),
        (
            ReduceOp::Avg,
            (0..n).map(|k| k as f32 + 1.0).sum::<f32>() / n as f32,
        ),
        (ReduceOp::Max, n as f32),
        (ReduceOp::Min, 1.0),
    ] {
        let mut b = vec![r as f32 + 1.0; len];
        g.all_reduce(&mut b, op).map_err(|e| e.to_string())?;
        if b.iter().any(|x| *x != want) {
            return Err(format!("nccl {op:?} gave {} instead of {want}", b[0]));
        }
    }
    let mut h = vec![half::bf16::from_f32(r as f32 + 0.5); len];
    g.all_reduce(&mut h, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let want = (0..n).map(|k| k as f32 + 0.5).sum::<f32>();
    if h.iter().any(|x| x.to_f32() != want) {
        return Err(format!("nccl bf16 sum gave {} instead of {want}", h[0]));
    }
    if r == 0 {
        eprintln!("nccl correctness: f32 sum/avg/max/min and bf16 sum ok on {n} ranks");
    }
    for bytes in sizes(a) {
        let count = bytes / 4;
        let iters = iters_for(bytes, a.iters_scale);
        let t = g
            .bench_all_reduce_f32(count, iters)
            .map_err(|e| e.to_string())?;
        report(a, r, n, "nccl", bytes, count, t);
    }
    Ok(())
}

#[cfg(not(feature = "nccl"))]
fn nccl_worker(_: &Args) -> Result<(), String> {
    Err("this build has no NCCL support (build with --features nccl)".into())
}

fn launch(a: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let dir = std::env::temp_dir().join(format!("rdrun-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut kids: Vec<Child> = Vec::new();
    for r in 0..a.nproc {
        let mut c = Command::new(&exe);
        c.args(&argv)
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", a.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", a.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "1")
            .env(
                "TORCHELASTIC_RUN_ID",
                format!("bench{}", std::process::id()),
            )
            .env("RDRUN_FILE_STORE", &dir)
            .env(
                "RDRUN_BACKEND",
                if a.backend == "nccl" {
                    "auto"
                } else {
                    &a.backend
                },
            )
            .stdin(Stdio::null());
        if a.nccl_fake_hosts {
            c.env("NCCL_HOSTID", format!("rdrun-fake-host-{r}"));
        }
        if r != 0 {
            c.stdout(Stdio::null());
        }
        kids.push(c.spawn().map_err(|e| format!("spawn rank {r}: {e}"))?);
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout_secs);
    let mut failed = None;
    let mut left: Vec<(usize, Child)> = kids.into_iter().enumerate().collect();
    while !left.is_empty() {
        let mut still = Vec::new();
        for (r, mut k) in left {
            match k.try_wait() {
                Ok(Some(st)) if !st.success() => {
                    failed.get_or_insert(format!("rank {r} exited with {st}"));
                }
                Ok(Some(_)) => {}
                _ => still.push((r, k)),
            }
        }
        left = still;
        if failed.is_some() || Instant::now() > deadline {
            for (_, k) in left.iter_mut() {
                let _ = k.kill();
                let _ = k.wait();
            }
            failed.get_or_insert("timed out".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    match failed {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// See `Args::copy_ceiling`. Threads share the memory system as rank processes do; each time is
/// the slowest thread's, as for an all-reduce.
fn copy_ceiling(a: &Args) {
    let n = a.nproc.max(1);
    for bytes in sizes(a) {
        let count = bytes / 4;
        let iters = iters_for(bytes, a.iters_scale);
        let start = std::sync::Barrier::new(n);
        let times: Vec<f64> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let start = &start;
                    sc.spawn(move || {
                        let src = vec![1.0f32; count];
                        let mut dst = vec![0.0f32; count];
                        dst.copy_from_slice(&src);
                        start.wait();
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            dst.copy_from_slice(std::hint::black_box(&src));
                            std::hint::black_box(&mut dst);
                        }
                        t0.elapsed().as_secs_f64() / iters as f64
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("copy thread"))
                .collect()
        });
        let t = times.iter().cloned().fold(0.0, f64::max);
        report(a, 0, n, "copy", bytes, count, t);
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RDRUN_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let res = if a.copy_ceiling {
        copy_ceiling(&a);
        Ok(())
    } else if std::env::var_os("RANK").is_some() {
        worker(&a)
    } else {
        launch(&a)
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdrun-allreduce-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
