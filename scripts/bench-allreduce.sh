#!/usr/bin/env bash
# All-reduce latency and bus bandwidth: rdrun's TCP and shared-memory backends vs PyTorch gloo,
# 2 and 4 ranks, 4 KiB .. 64 MiB, in one run on this machine. Prints one comparison table
# (markdown) on stdout; raw JSON lines are kept in $RDRUN_BENCH_OUT (default: a temp dir).
#
# Env: RDRUN_BENCH_RANKS ("2 4"), RDRUN_BENCH_MAX_BYTES (67108864), RDRUN_BENCH_ITERS_SCALE (1.0),
#      RDRUN_SKIP_TORCH=1 to skip gloo.
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS="${RDRUN_BENCH_RANKS:-2 4}"
MAX="${RDRUN_BENCH_MAX_BYTES:-67108864}"
SCALE="${RDRUN_BENCH_ITERS_SCALE:-1.0}"
OUT="${RDRUN_BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rdrun-bench.XXXXXX")}"
mkdir -p "$OUT"
: > "$OUT/results.jsonl"

echo "== building rdrun-allreduce-bench (release)" >&2
cargo build --release --quiet --no-default-features --bin rdrun-allreduce-bench >&2
BENCH=target/release/rdrun-allreduce-bench

for n in $RANKS; do
  for b in tcp shm; do
    echo "== rdrun $b, $n ranks" >&2
    "$BENCH" --nproc "$n" --backend "$b" --max-bytes "$MAX" --iters-scale "$SCALE" --json \
      >> "$OUT/results.jsonl"
  done
done

if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ]; then
  PY="$(scripts/torch-venv.sh | tail -n 1)"
  cat > "$OUT/gloo_bench.py" <<'PYEOF'
# gloo all-reduce with the same sizes, iteration counts and timing rule as rdrun's bench:
# warm up, barrier, time `iters` back-to-back all_reduce(SUM) calls, report the slowest rank.
import json, os, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def iters_for(nbytes, scale):
    base = min(max((64 << 20) // nbytes, 5), 2000)
    return max(int(base * scale), 3)

def run(rank, world, init, max_bytes, scale, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    size = 4096
    while size <= max_bytes:
        t = torch.zeros(size // 4, dtype=torch.float32)
        it = iters_for(size, scale)
        for _ in range(min(2, it)):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(it):
            dist.all_reduce(t)
        el = torch.tensor([(time.perf_counter() - t0) / it], dtype=torch.float64)
        dist.all_reduce(el, op=dist.ReduceOp.MAX)
        if rank == 0:
            s = el.item()
            algbw = size / s / 1e9
            with open(out, "a") as f:
                f.write(json.dumps({"impl": "gloo", "backend": "gloo", "world": world, "bytes": size,
                                    "time_us": s * 1e6, "algbw": algbw,
                                    "busbw": algbw * 2 * (world - 1) / world}) + "\n")
        size *= 4
    dist.destroy_process_group()

if __name__ == "__main__":
    world, max_bytes, scale, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    d = tempfile.mkdtemp()
    mp.spawn(run, args=(world, "file://" + os.path.join(d, "store"), max_bytes, scale, out), nprocs=world)
PYEOF
  for n in $RANKS; do
    echo "== PyTorch gloo, $n ranks" >&2
    OMP_NUM_THREADS=1 "$PY" "$OUT/gloo_bench.py" "$n" "$MAX" "$SCALE" "$OUT/results.jsonl"
  done
fi

python3 - "$OUT/results.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["backend"], r["world"], r["bytes"]): r for r in rows}
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print("| ranks | size | gloo µs | tcp µs | shm µs | gloo busbw GB/s | tcp busbw GB/s | shm busbw GB/s | gloo/tcp time | gloo/shm time |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (w, b) in sorted({(r["world"], r["bytes"]) for r in rows}):
    g, t, s = by.get(("gloo", w, b)), by.get(("tcp", w, b)), by.get(("shm", w, b))
    f = lambda r, k, fmt: (fmt % r[k]) if r else "-"
    ratio = lambda a, c: f"{a['time_us'] / c['time_us']:.1f}x" if a and c else "-"
    print(f"| {w} | {size(b)} | {f(g,'time_us','%.1f')} | {f(t,'time_us','%.1f')} | {f(s,'time_us','%.1f')} | "
          f"{f(g,'busbw','%.3f')} | {f(t,'busbw','%.3f')} | {f(s,'busbw','%.3f')} | {ratio(g,t)} | {ratio(g,s)} |")
PYEOF
echo "raw results: $OUT/results.jsonl" >&2
