#!/usr/bin/env bash
# One prepared run for a machine with one NVIDIA GPU, CUDA, PyTorch and pip's NCCL but no Rust.
# Binaries are built elsewhere and carried:
#   cargo build --release --features nccl --bin rdrun-allreduce-bench --bin rdrun --bin train
# (RDRUN_BIN_DIR overrides target/release). Finishes in well under 5 minutes and prints one
# markdown table: NCCL through rdrun's runtime vs PyTorch's NCCL (the same ncclAllReduce) at world
# 1 and world 2 on one GPU (per-rank NCCL_HOSTID, spec runtime.md §4.2), the duplicate-GPU
# negative check, PyTorch nccl DDP (world 1) under rdrun, and a warm NCCL DDP restart (2 ranks on
# one GPU, workers forked from the template).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${RDRUN_BIN_DIR:-target/release}"
PY="${RDRUN_PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rdrun-gpu.XXXXXX")"
RES="$WORK/results.jsonl"
: > "$RES"
note() { echo "== $*" >&2; }
# One line of text safe inside a JSON string.
clean() { tr -d '\\\r' | tr '\n\t"' '  _' | cut -c1-300; }
row() { printf '{"check":"%s","world":%s,"bytes":%s,"impl":"%s","time_us":%s,"busbw":%s,"result":"%s"}\n' "$@" >> "$RES"; }

[ -x "$BIN/rdrun-allreduce-bench" ] || { echo "gpu-check: $BIN/rdrun-allreduce-bench missing (build with --features nccl)" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true

# 1. Make the pip NCCL loadable by cudarc (it never tries libnccl.so.2; spec §1.4).
NCCL_DIR="$("$PY" -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null || true)"
if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/libnccl.so.2" ]; then
  mkdir -p "$WORK/nccl-lib"
  ln -sf "$NCCL_DIR/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
  export LD_LIBRARY_PATH="$WORK/nccl-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "pip NCCL: $NCCL_DIR/libnccl.so.2"
else
  note "no pip NCCL found (import nvidia.nccl failed); relying on the system library path"
fi
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 OMP_NUM_THREADS=1

# 2. rdrun runtime: world 1 (correctness + bandwidth), world 2 on one GPU with fake host ids.
bench_rows() { # check world extra-args...
  local check="$1" world="$2"; shift 2
  if timeout 90 "$BIN/rdrun-allreduce-bench" --backend nccl --nproc "$world" --json "$@" \
       > "$WORK/$check.out" 2> "$WORK/$check.err"; then
    "$PY" - "$WORK/$check.out" "$check" "$RES" <<'PYEOF'
import json, sys
out = open(sys.argv[3], "a")
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        out.write(json.dumps({"check": sys.argv[2], "world": r["world"], "bytes": r["bytes"], "impl": "rdrun",
                              "time_us": r["time_us"], "busbw": r["busbw"], "result": "ok"}) + "\n")
PYEOF
  else
    row "$check" "$world" 0 rdrun 0 0 "FAIL: $(tail -n 2 "$WORK/$check.err" | clean)"
  fi
}
note "rdrun nccl world 1"
bench_rows nccl-w1 1 --min-bytes 4096 --max-bytes 268435456 --iters-scale 0.5
note "rdrun nccl world 2 (NCCL_HOSTID per rank)"
RDRUN_CUDA_DEVICE=0 bench_rows nccl-w2-fakehost 2 --nccl-fake-hosts --min-bytes 4096 --max-bytes 16777216 --iters-scale 0.02

# 3. Negative: two ranks on one GPU without fake hosts must fail with NCCL's own text, not hang.
note "duplicate GPU negative check"
if RDRUN_CUDA_DEVICE=0 RDRUN_TIMEOUT_SECS=30 timeout 60 "$BIN/rdrun-allreduce-bench" --backend nccl --nproc 2 \
     --max-bytes 4096 > "$WORK/dup.out" 2> "$WORK/dup.err"; then
  row dup-gpu 2 0 rdrun 0 0 "FAIL: expected an error"
elif grep -q "Duplicate GPU" "$WORK/dup.err" && ! grep -q "panicked" "$WORK/dup.err"; then
  row dup-gpu 2 0 rdrun 0 0 "ok: error names Duplicate GPU"
else
  row dup-gpu 2 0 rdrun 0 0 "FAIL: $(grep -m1 -E 'nccl|panick|init' "$WORK/dup.err" | clean)"
fi

# 3b. The runtime's backend choice with a GPU, through the `train` demo (if carried): forced
#     `nccl` trains through NCCL; `auto` keeps host slices on shm and brings up NCCL for the device.
if [ -x "$BIN/train" ] && [ -x "$BIN/rdrun" ]; then
  note "train --backend nccl, world 1 and 2 (fake hosts) under rdrun"
  for w in 1 2; do
    if RDRUN_CUDA_DEVICE=0 timeout 120 "$BIN/rdrun" --nproc_per_node=$w \
         sh -c 'NCCL_HOSTID=fake-$RANK exec "$0" "$@"' "$BIN/train" --backend nccl --epochs 2 \
         > "$WORK/train-nccl-$w.out" 2>&1 && grep -q "backend nccl" "$WORK/train-nccl-$w.out"; then
      row train-nccl "$w" 0 rdrun 0 0 "ok"
    else
      row train-nccl "$w" 0 rdrun 0 0 "FAIL: $(grep -m1 -iE 'error|panick' "$WORK/train-nccl-$w.out" | clean)"
    fi
  done
  note "train --backend auto, world 1: NCCL for the device next to shm"
  if timeout 120 "$BIN/rdrun" --nproc_per_node=1 "$BIN/train" --epochs 1 > "$WORK/train-auto.out" 2>&1 \
     && grep -q "nccl communicator on CUDA device 0" "$WORK/train-auto.out"; then
    row train-auto-nccl 1 0 rdrun 0 0 "ok"
  else
    row train-auto-nccl 1 0 rdrun 0 0 "FAIL: $(grep -m1 -iE 'error|panick|backend' "$WORK/train-auto.out" | clean)"
  fi
else
  row train-nccl 1 0 rdrun 0 0 "skipped: $BIN/train or $BIN/rdrun not carried"
fi

# 4. PyTorch's NCCL (the same library call) at the same sizes, world 1 and 2 (fake hosts).
cat > "$WORK/torch_nccl.py" <<'PYEOF'
import json, os, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
def iters_for(nbytes, scale):
    return max(int(min(max((64 << 20) // nbytes, 5), 2000) * scale), 3)
def run(rank, world, init, lo, hi, scale, check, out):
    if world > 1:
        os.environ["NCCL_HOSTID"] = f"torch-fake-host-{rank}"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
    size = lo
    while size <= hi:
        t = torch.zeros(size // 4, device="cuda")
        it = iters_for(size, scale)
        for _ in range(2):
            dist.all_reduce(t)
        torch.cuda.synchronize(); dist.barrier()
        t0 = time.perf_counter()
        for _ in range(it):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        s = (time.perf_counter() - t0) / it
        if rank == 0:
            bus = size / s / 1e9 * 2 * (world - 1) / world
            with open(out, "a") as f:
                f.write(json.dumps({"check": check, "world": world, "bytes": size, "impl": "torch-nccl",
                                    "time_us": s * 1e6, "busbw": bus, "result": "ok"}) + "\n")
        size *= 4
    dist.destroy_process_group()
if __name__ == "__main__":
    world, lo, hi, scale, check, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
    d = tempfile.mkdtemp()
    mp.spawn(run, args=(world, "file://" + os.path.join(d, "s"), lo, hi, scale, check, out), nprocs=world)
PYEOF
note "PyTorch nccl world 1"
timeout 90 "$PY" "$WORK/torch_nccl.py" 1 4096 268435456 0.5 nccl-w1 "$RES" 2> "$WORK/torch1.err" \
  || row nccl-w1 1 0 torch-nccl 0 0 "FAIL: $(tail -n1 "$WORK/torch1.err" | clean)"
note "PyTorch nccl world 2 (fake hosts)"
timeout 60 "$PY" "$WORK/torch_nccl.py" 2 4096 16777216 0.02 nccl-w2-fakehost "$RES" 2> "$WORK/torch2.err" \
  || row nccl-w2-fakehost 2 0 torch-nccl 0 0 "FAIL: $(tail -n1 "$WORK/torch2.err" | clean)"

# 5. PyTorch nccl DDP, world 1, under rdrun (if the launcher binary was carried).
cat > "$WORK/ddp_nccl.py" <<'PYEOF'
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
m = DDP(torch.nn.Linear(64, 64).cuda())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(32, 64, device="cuda")
first = None
for _ in range(20):
    opt.zero_grad(); loss = m(x).pow(2).mean(); loss.backward(); opt.step()
    first = first if first is not None else loss.item()
assert loss.item() < first, (first, loss.item())
print("ddp ok", first, loss.item())
dist.destroy_process_group()
PYEOF
if [ -x "$BIN/rdrun" ]; then
  note "PyTorch DDP (nccl, world 1) under rdrun"
  if timeout 60 "$BIN/rdrun" --nproc_per_node=1 "$WORK/ddp_nccl.py" > "$WORK/ddp.out" 2>&1 \
     && grep -q "ddp ok" "$WORK/ddp.out"; then
    row ddp-under-rdrun 1 0 torch-ddp 0 0 "ok"
  else
    row ddp-under-rdrun 1 0 torch-ddp 0 0 "FAIL: $(grep -m1 -E 'Error|error' "$WORK/ddp.out" | clean)"
  fi
else
  row ddp-under-rdrun 1 0 torch-ddp 0 0 "skipped: $BIN/rdrun not carried"
fi

# 6. Warm NCCL DDP restart (issue 37 item 5): 2 ranks on one GPU (per-rank NCCL_HOSTID), workers
#    forked from the template, rank 1 dies at step 5 of attempt 0, `--max-restarts 1`. Checks:
#    both attempts' workers were forked warm, the template never opened a GPU (CUDA initialised
#    only in the workers), attempt 1 trains, and rdrun's restart-cost line is there.
cat > "$WORK/ddp_warm.py" <<'PYEOF'
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ["NCCL_HOSTID"] = "rdrun-gpu-check-%s" % os.environ["LOCAL_RANK"]
dist.init_process_group("nccl")
torch.cuda.set_device(0)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
m = DDP(torch.nn.Linear(64, 64).cuda())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(32, 64, device="cuda")
for step in range(10):
    if attempt == 0 and dist.get_rank() == 1 and step == 5:
        os._exit(7)
    opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
print("warm ddp ok attempt", attempt, flush=True)
dist.destroy_process_group()
os._exit(0)
PYEOF
if [ -x "$BIN/rdrun" ]; then
  note "warm NCCL DDP restart (2 ranks, one GPU) under rdrun"
  if RUST_LOG=warn,rdrun::supervisor::group::warm=debug timeout 180 "$BIN/rdrun" --nproc_per_node=2 --warm-start on --max-restarts 1 \
       "$WORK/ddp_warm.py" > "$WORK/warm.out" 2>&1 \
     && [ "$(grep -c 'warm ddp ok attempt 1' "$WORK/warm.out")" = 2 ] \
     && [ "$(grep -c 'worker forked from the template' "$WORK/warm.out")" -ge 4 ] \
     && grep -q 'restart 1: .*forked warm' "$WORK/warm.out" \
     && ! grep -q 'warm start: .*cold' "$WORK/warm.out"; then
    row warm-nccl-restart 2 0 torch-ddp 0 0 "ok: $(grep -m1 'restart 1: ' "$WORK/warm.out" | sed 's/.*restart 1/restart 1/' | clean)"
  else
    row warm-nccl-restart 2 0 torch-ddp 0 0 "FAIL: $(grep -m1 -E 'Error|error|cold' "$WORK/warm.out" | clean)"
  fi
else
  row warm-nccl-restart 2 0 torch-ddp 0 0 "skipped: $BIN/rdrun not carried"
fi

"$PY" - "$RES" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def size(b):
    return "-" if not b else (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB")
print("| check | world | size | rdrun µs | torch-nccl µs | rdrun busbw GB/s | torch busbw GB/s | result |")
print("|---|---|---|---|---|---|---|---|")
keys = []
for r in rows:
    k = (r["check"], r["world"], r["bytes"])
    if k not in keys:
        keys.append(k)
for k in keys:
    rd = next((r for r in rows if (r["check"], r["world"], r["bytes"]) == k and r["impl"] == "rdrun"), None)
    tn = next((r for r in rows if (r["check"], r["world"], r["bytes"]) == k and r["impl"] != "rdrun"), None)
    f = lambda r, key: f"{r[key]:.2f}" if r and r["result"] == "ok" and r[key] else "-"
    res = "; ".join(r["result"] for r in (rd, tn) if r and r["result"] != "ok") or "ok"
    print(f"| {k[0]} | {k[1]} | {size(k[2])} | {f(rd,'time_us')} | {f(tn,'time_us')} | {f(rd,'busbw')} | {f(tn,'busbw')} | {res} |")
PYEOF
