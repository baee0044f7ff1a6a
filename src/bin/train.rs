//! The `train` demo: a small candle MLP trained data-parallel through rdrun's runtime.
//!
//! `rdrun --nproc_per_node=4 train` (or plain `train` for one process): deterministic synthetic
//! regression data, a DistributedSampler-like split (one permutation per epoch shared by all
//! ranks; inside each global batch rank r takes every world-th sample), gradients averaged by the
//! DDP reducer, SGD. `--batch-size` is the *global* batch, so 1, 2 or 4 workers take the same
//! optimisation path up to float rounding. Rank 0 prints the full-data loss per epoch and saves
//! an atomic checkpoint (write to a temp file, fsync, rename); on restart every rank resumes
//! from it. At the end every rank checks that all ranks hold bit-identical parameters and that the
//! loss fell; either failure exits 1.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use candle_core::{Device, Tensor, Var};
use candle_nn::optim::{Optimizer, SGD};
use clap::Parser;
use rdrun::runtime::candle::{var_to_vec, vars_hash, CandleDdp};
use rdrun::runtime::{BackendChoice, GroupOptions, MemStore, ProcessGroup, ReducerOptions};

#[derive(Parser, Debug)]
#[command(name = "train", about = "Data-parallel candle MLP demo for rdrun")]
struct Args {
    /// Collective backend: auto, tcp, shm, hier or nccl (nccl needs a build with `--features nccl` and a GPU per rank; also RDRUN_BACKEND).
    #[arg(long, default_value = "auto")]
    backend: String,
    #[arg(long, default_value_t = 5)]
    epochs: u32,
    /// Global batch size (split evenly across ranks).
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 2048)]
    samples: usize,
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory for `train.ckpt` (rank 0 writes it after every epoch; all ranks resume from it).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Make `--fail-rank` exit with code 1 when it starts this epoch (1-based), first attempt only.
    #[arg(long)]
    fail_at_epoch: Option<u32>,
    #[arg(long, default_value_t = 0)]
    fail_rank: usize,
}

const FEATURES: usize = 8;

/// xorshift64*: a tiny deterministic generator (no rand dependency needed).
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Inputs and targets: y = sum_k tanh(x . t_k) / 2 for fixed teacher vectors t_k.
fn dataset(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed ^ 0xDA7A);
    let teacher: Vec<f32> = (0..FEATURES * 3).map(|_| rng.uniform()).collect();
    let x: Vec<f32> = (0..n * FEATURES).map(|_| rng.uniform()).collect();
    let y = (0..n)
        .map(|i| {
            let xi = &x[i * FEATURES..(i + 1) * FEATURES];
            (0..3)
                .map(|k| {
                    let d: f32 = xi
                        .iter()
                        .zip(&teacher[k * FEATURES..(k + 1) * FEATURES])
                        .map(|(a, b)| a * b)
                        .sum();
                    d.tanh()
                })
                .sum::<f32>()
                / 2.0
        })
        .collect();
    (x, y)
}

/// The epoch's permutation (identical on every rank).
fn permutation(n: usize, seed: u64, epoch: u32) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = Rng::new(seed ^ ((epoch as u64 + 1) << 32));
    for i in (1..n).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

struct Mlp {
    w1: Var,
    b1: Var,
    w2: Var,
    b2: Var,
}

impl Mlp {
    fn new(hidden: usize, seed: u64, dev: &Device) -> candle_core::Result<Self> {
        let mut rng = Rng::new(seed ^ 0x1417);
        let mut init =
            |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| rng.uniform() * scale).collect() };
        let s1 = 1.0 / (FEATURES as f32).sqrt();
        let s2 = 1.0 / (hidden as f32).sqrt();
        Ok(Mlp {
            w1: Var::from_vec(init(FEATURES * hidden, s1), (FEATURES, hidden), dev)?,
            b1: Var::from_vec(vec![0f32; hidden], hidden, dev)?,
            w2: Var::from_vec(init(hidden, s2), (hidden, 1), dev)?,
            b2: Var::from_vec(vec![0f32; 1], 1, dev)?,
        })
    }
    fn vars(&self) -> Vec<Var> {
        vec![
            self.w1.clone(),
            self.b1.clone(),
            self.w2.clone(),
            self.b2.clone(),
        ]
    }
    fn loss(&self, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
        let h = x
            .matmul(self.w1.as_tensor())?
            .broadcast_add(self.b1.as_tensor())?
            .relu()?;
        let p = h
            .matmul(self.w2.as_tensor())?
            .broadcast_add(self.b2.as_tensor())?;
        (p.squeeze(1)? - y)?.sqr()?.mean_all()
    }
}

const CKPT_MAGIC: &[u8; 8] = b"RDCKPT01";

/// Saves `epochs_done` and every variable atomically: temp file, fsync, rename, fsync dir.
fn save_checkpoint(dir: &Path, epochs_done: u32, vars: &[Var]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut bytes = CKPT_MAGIC.to_vec();
    bytes.extend_from_slice(&epochs_done.to_le_bytes());
    bytes.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for v in vars {
        let h = var_to_vec(v, 0).map_err(|e| e.to_string())?;
        bytes.extend_from_slice(&(h.len() as u32).to_le_bytes());
        bytes.extend_from_slice(bytemuck::cast_slice(&h));
    }
    let tmp = dir.join(format!("train.ckpt.tmp.{}", std::process::id()));
    let fin = dir.join("train.ckpt");
    let mut f =
        std::fs::File::create(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    f.write_all(&bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &fin).map_err(|e| format!("rename to {}: {e}", fin.display()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Loads the checkpoint if there is one: returns the number of completed epochs.
fn load_checkpoint(dir: &Path, vars: &[Var]) -> Result<Option<u32>, String> {
    let path = dir.join("train.ckpt");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    let bad = || format!("{} is not a checkpoint of this model", path.display());
    let u32_at = |o: usize| -> Result<u32, String> {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(bad)
    };
    if bytes.get(..8) != Some(&CKPT_MAGIC[..]) || u32_at(12)? as usize != vars.len() {
        return Err(bad());
    }
    let epochs = u32_at(8)?;
    let mut off = 16;
    for v in vars {
        let n = u32_at(off)? as usize;
        off += 4;
        if n != v.elem_count() || bytes.len() < off + 4 * n {
            return Err(bad());
        }
        let mut h = vec![0f32; n];
        bytemuck::cast_slice_mut::<f32, u8>(&mut h).copy_from_slice(&bytes[off..off + 4 * n]);
        off += 4 * n;
        let t = Tensor::from_vec(h, v.shape(), v.device()).map_err(|e| e.to_string())?;
        v.set(&t).map_err(|e| e.to_string())?;
    }
    Ok(Some(epochs))
}

fn run(args: Args) -> Result<(), String> {
    let group = Arc::new(join_group(&args)?);
    let (rank, world) = (group.rank(), group.world_size());
    check_sizes(&args, world)?;
    let dev = Device::Cpu;
    let (xs, ys) = dataset(args.samples, args.seed);
    let x_all =
        Tensor::from_vec(xs.clone(), (args.samples, FEATURES), &dev).map_err(|e| e.to_string())?;
    let y_all = Tensor::from_vec(ys.clone(), args.samples, &dev).map_err(|e| e.to_string())?;
    let model = Mlp::new(args.hidden, args.seed, &dev).map_err(|e| e.to_string())?;
    let start_epoch = resume(&args, &model, rank)?;
    let mut ddp = CandleDdp::new(group.clone(), model.vars(), ReducerOptions::default())
        .map_err(|e| e.to_string())?;
    let mut opt = SGD::new(model.vars(), args.lr).map_err(|e| e.to_string())?;
    let full_loss = |m: &Mlp| -> Result<f32, String> {
        m.loss(&x_all, &y_all)
            .and_then(|l| l.to_scalar::<f32>())
            .map_err(|e| e.to_string())
    };
    let initial = full_loss(&model)?;
    if rank == 0 {
        print_start(&args, &group, initial);
    }
    let restart: u32 = std::env::var("TORCHELASTIC_RESTART_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let steps = args.samples / args.batch_size;
    // Heartbeats on the launcher's FileTimer FIFO, once per step (rate-limited to one write a
    // second); a no-op unless TORCHELASTIC_TIMER_FILE is set.
    let watchdog = rdrun::runtime::Watchdog::from_env();
    let mut global_step = u64::from(start_epoch) * steps as u64;
    let mut loss = initial;
    for epoch in start_epoch..args.epochs {
        if args.fail_at_epoch == Some(epoch + 1) && args.fail_rank == rank && restart == 0 {
            eprintln!("rank {rank}: injected failure at epoch {}", epoch + 1);
            std::process::exit(1);
        }
        let perm = permutation(args.samples, args.seed, epoch);
        for step in 0..steps {
            let (bx, by) = batch(&args, (&xs, &ys), &perm, step, (rank, world), &dev)?;
            let l = model.loss(&bx, &by).map_err(|e| e.to_string())?;
            let mut grads = l.backward().map_err(|e| e.to_string())?;
            ddp.sync_grads(&mut grads).map_err(|e| e.to_string())?;
            opt.step(&grads).map_err(|e| e.to_string())?;
            global_step += 1;
            if let Some(w) = &watchdog {
                w.beat(Some(global_step));
            }
        }
        loss = full_loss(&model)?;
        if rank == 0 {
            println!("epoch {}/{} loss {loss}", epoch + 1, args.epochs);
            if let Some(dir) = &args.checkpoint_dir {
                save_checkpoint(dir, epoch + 1, &model.vars())?;
            }
        }
    }
    let h = check_identical(&group, &model)?;
    if rank == 0 {
        println!("params identical on {world} ranks (hash {:016x})", h as u64);
        println!("final loss {loss}");
    }
    if args.epochs > start_epoch && loss >= initial {
        return Err(format!("loss did not fall: {initial} -> {loss}"));
    }
    group.barrier().map_err(|e| e.to_string())?;
    Ok(())
}

/// The process group: the launcher's (under rdrun, `RANK` set) or a standalone one of one rank.
fn join_group(args: &Args) -> Result<ProcessGroup, String> {
    let backend: BackendChoice = args.backend.parse()?;
    if std::env::var_os("RANK").is_some() {
        if args.backend != "auto" {
            std::env::set_var("RDRUN_BACKEND", &args.backend);
        }
        ProcessGroup::init_from_env().map_err(|e| e.to_string())
    } else {
        let mut o = GroupOptions::new(0, 1, "standalone");
        o.backend = backend;
        ProcessGroup::new(&MemStore::new(), &o).map_err(|e| e.to_string())
    }
}

/// The global batch divides among the ranks, and the data holds at least one batch.
fn check_sizes(args: &Args, world: usize) -> Result<(), String> {
    if args.batch_size == 0 || args.batch_size % world != 0 {
        return Err(format!(
            "--batch-size {} must be a positive multiple of the world size {world}",
            args.batch_size
        ));
    }
    if args.samples < args.batch_size {
        return Err(format!(
            "--samples {} must be at least --batch-size {}",
            args.samples, args.batch_size
        ));
    }
    Ok(())
}

/// Loads the checkpoint into `model` when there is one: the epoch to start from.
fn resume(args: &Args, model: &Mlp, rank: usize) -> Result<u32, String> {
    if let Some(dir) = &args.checkpoint_dir {
        if let Some(done) = load_checkpoint(dir, &model.vars())? {
            if rank == 0 {
                println!("resumed from checkpoint after epoch {done}");
            }
            return Ok(done);
        }
    }
    Ok(0)
}

/// Rank 0's first lines: the run's shape and the starting loss.
fn print_start(args: &Args, group: &ProcessGroup, initial: f32) {
    println!(
        "train: world {}, backend {}, {} samples, global batch {}, start loss {initial}",
        group.world_size(),
        group.backend_name(),
        args.samples,
        args.batch_size
    );
    // The device communicator `auto` brings up on GPU machines (the MLP itself stays on the
    // CPU; scripts/gpu-check.sh looks for this line).
    #[cfg(feature = "nccl")]
    if let Some(n) = group.nccl() {
        println!(
            "train: nccl communicator on CUDA device {}",
            n.device_ordinal()
        );
    }
}

/// This rank's share of global batch `step` of the epoch's permutation: inside the batch, rank
/// r takes every world-th sample.
fn batch(
    args: &Args,
    (xs, ys): (&[f32], &[f32]),
    perm: &[usize],
    step: usize,
    (rank, world): (usize, usize),
    dev: &Device,
) -> Result<(Tensor, Tensor), String> {
    let per_rank = args.batch_size / world;
    let idx: Vec<usize> = (0..per_rank)
        .map(|j| perm[step * args.batch_size + rank + world * j])
        .collect();
    let bx: Vec<f32> = idx
        .iter()
        .flat_map(|i| xs[i * FEATURES..(i + 1) * FEATURES].iter().copied())
        .collect();
    let by: Vec<f32> = idx.iter().map(|i| ys[*i]).collect();
    let bx = Tensor::from_vec(bx, (per_rank, FEATURES), dev).map_err(|e| e.to_string())?;
    let by = Tensor::from_vec(by, per_rank, dev).map_err(|e| e.to_string())?;
    Ok((bx, by))
}

/// Every rank holds bit-identical parameters: their hash, gathered and compared.
fn check_identical(group: &ProcessGroup, model: &Mlp) -> Result<i64, String> {
    let (rank, world) = (group.rank(), group.world_size());
    let h = vars_hash(&model.vars(), rank).map_err(|e| e.to_string())? as i64;
    let mut all = vec![0i64; world];
    group
        .all_gather(&[h], &mut all)
        .map_err(|e| e.to_string())?;
    if let Some(r) = all.iter().position(|x| *x != h) {
        return Err(format!(
            "rank {r} holds different parameters than rank {rank}"
        ));
    }
    Ok(h)
}

fn main() -> ExitCode {
    // One compute thread per worker: several workers share few cores (torchrun sets
    // OMP_NUM_THREADS=1 for the same reason); candle's CPU kernels honour RAYON_NUM_THREADS.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RDRUN_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train: {e}");
            ExitCode::FAILURE
        }
    }
}
