#!/usr/bin/env bash
# Recovery benchmark (issue 27): how long a real gloo DDP job loses per failure, rdrun with warm
# start (workers forked from the template interpreter), rdrun cold and torchrun, side by side.
#   The job: NPROC ranks train a small DDP model; on attempt 0 rank 1 dies (os._exit) at step 5,
#   `--max-restarts 1`. Every rank of attempt 1 writes time stamps (time.time_ns) when its
#   script starts, when `import torch` is done, when the process group is ready and when its
#   first training step is done. Reported per point: crash -> the LAST rank to reach it
#   (medians over RUNS runs), and the ratios cold/warm and torchrun/warm.
#   The template's own cost (its start-up, once per run) is printed from rdrun's log.
#   A fourth column, "warm+preload", adds `--preload` of what DDP's constructor imports lazily
#   (torch._dynamo, torch._inductor, torch.onnx: ~900 modules, seconds), which otherwise every
#   rank of every attempt pays before its first step.
#   Memory: summed PSS of 4 and 8 workers (MEM_SIZES) after `import torch`, warm (template
#   included) vs cold, split into anonymous and file-backed pages.
# Usage: scripts/bench-recovery.sh   (env: RUNS=3, SIZES="2 4", PARTS="recovery memory",
#        KINDS="warm warmplus cold torchrun" (the columns to run), MEM_SIZES="4 8",
#        PRELOAD=mods, TORCHRUN=path, RDRUN=path, PYTHON=path, PLOTS=folder (recovery.png and
#        memory.png drawn there); rdrun is built in release mode unless RDRUN is given)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
SIZES="${SIZES:-2 4}"
# shellcheck source=scripts/bench-torch-lib.sh
. scripts/bench-torch-lib.sh bench-recovery

cat >"$TMP/job.py" <<'EOF'
import os, sys, time
t_start = time.time_ns()
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
marks = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])


def mark(*points):
    # One line per point reached, written at once: a rank that dies later keeps what it reached.
    if attempt == 1:
        with open(os.path.join(marks, "a1.%d" % rank), "a") as f:
            for name, t in points:
                f.write("%s %d\n" % (name, t))


mark(("start", t_start), ("import", time.time_ns()))
dist.init_process_group("gloo")
mark(("pg", time.time_ns()))
torch.manual_seed(0)
model = DDP(nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12 if attempt == 0 else 3):
    if attempt == 0 and rank == 1 and step == 5:
        with open(os.path.join(marks, "crash"), "w") as f:
            f.write(str(time.time_ns()))
        os._exit(7)
    opt.zero_grad()
    model(torch.randn(32, 64)).pow(2).sum().backward()
    opt.step()
    if step == 0:
        mark(("step", time.time_ns()))
    time.sleep(0.05)
dist.destroy_process_group()
EOF

# run_one NPROC KIND -> appends "start import pg step" (seconds after the crash, last rank) to
# $TMP/res.KIND.NPROC
run_one() {
  local n=$1 kind=$2 cmd
  rm -f "$MARKS"/*
  case $kind in
    warm) cmd=("$RDRUN" --warm-start on) ;;
    warmplus) cmd=("$RDRUN" --warm-start on --preload "$PRELOAD") ;;
    cold) cmd=("$RDRUN" --warm-start off) ;;
    torchrun) cmd=("$TORCHRUN") ;;
  esac
  if ! PYTHON_EXEC="$PYTHON" RUST_LOG=rdrun=info timeout 600 "${cmd[@]}" --standalone \
      --nproc-per-node "$n" --max-restarts 1 "$TMP/job.py" "$MARKS" \
      >"$TMP/out" 2>"$TMP/err"; then
    # torchrun 2.15's attempt 1 may die in gloo's connectFullMesh (it reads attempt 0's
    # addresses from the store it did not clear): the points it reached still count.
    echo "bench-recovery: note: a $kind run with $n ranks failed; points not reached show as -" >&2
  fi
  grep -o 'template interpreter pid [0-9]* ready in [0-9.]* s' "$TMP/err" \
    | awk '{print $(NF-1)}' >>"$TMP/template.$kind.$n" || true
  if [ ! -f "$MARKS/crash" ]; then
    echo "bench-recovery: error: the $kind run with $n ranks never crashed" >&2
    tail -n 20 "$TMP/err" >&2
    exit 1
  fi
  local crash line=""
  crash=$(cat "$MARKS/crash")
  for point in start import pg step; do
    # The last rank to reach the point; nan when a rank never reached it.
    line+="$(cat "$MARKS"/a1.* 2>/dev/null | awk -v p="$point" -v c="$crash" -v n="$n" '
      $1 == p { k++; if ($2 > m) m = $2 }
      END { if (k < n) print "nan"; else printf "%.3f", (m - c) / 1e9 }') "
  done
  echo "$line" >>"$TMP/res.$kind.$n"
}

PRELOAD="${PRELOAD:-torch._dynamo,torch._inductor,torch.onnx}"
read -r -a kinds <<<"${KINDS:-warm warmplus cold torchrun}"
if [[ " ${kinds[*]} " == *" torchrun "* && ! -x "$TORCHRUN" ]]; then
  echo "bench-recovery: no torchrun at $TORCHRUN; skipped" >&2
  read -r -a kinds <<<"$(printf '%s\n' "${kinds[@]}" | grep -vx torchrun | tr '\n' ' ')"
fi

if [[ " ${PARTS:-recovery memory} " == *" recovery "* ]]; then
for n in $SIZES; do
  for ((r = 0; r < RUNS; r++)); do
    # Interleaved, so that a change in the machine's load hits every launcher alike.
    for kind in "${kinds[@]}"; do run_one "$n" "$kind"; done
  done
done

# The median of column $1 over the runs that reached the point (nan when none did).
col() { if [ -f "$2" ]; then awk -v c="$1" '$c != "nan" {print $c}' "$2" | median; else echo nan; fi; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $RUNS runs each"
for n in $SIZES; do
  echo
  echo "$n ranks: crash -> every rank of attempt 1 at each point (median seconds)"
  printf '%-22s %8s %13s %8s %9s %10s %14s\n' point "warm" "warm+preload" "cold" torchrun "cold/warm" "torchrun/warm"
  i=0
  for point in "process started" "import torch done" "process group ready" "first step done"; do
    i=$((i + 1))
    w=$(col $i "$TMP/res.warm.$n"); p2=$(col $i "$TMP/res.warmplus.$n"); c=$(col $i "$TMP/res.cold.$n")
    t=$(col $i "$TMP/res.torchrun.$n")
    for kv in "rdrun warm=$w" "warm + preload=$p2" "rdrun cold=$c" "torchrun=$t"; do
      [[ " ${kinds[*]} " == *" $(case ${kv%%=*} in "rdrun warm") echo warm ;; "warm + preload") echo warmplus ;; "rdrun cold") echo cold ;; *) echo torchrun ;; esac) "* ]] &&
        printf '%s ranks: %s\t%s\t%s\n' "$n" "$point" "${kv%%=*}" "${kv#*=}" >>"$TMP/plot.recovery.tsv"
    done
    awk -v p="$point" -v w="$w" -v w2="$p2" -v c="$c" -v t="$t" '
      function f(x) { return x == "nan" ? "-" : sprintf("%.3f", x) }
      function r(x, y) { return (x == "nan" || y == "nan" || y <= 0) ? "-" : sprintf("%.1fx", x / y) }
      BEGIN { printf "%-22s %8s %13s %8s %9s %10s %14s\n", p, f(w), f(w2), f(c), f(t), r(c, w), r(t, w) }'
  done
  echo "template start-up (once per run, before attempt 0): warm $(cat "$TMP/template.warm.$n" 2>/dev/null | median) s, warm+preload $(cat "$TMP/template.warmplus.$n" 2>/dev/null | median) s"
done
plot "$TMP/plot.recovery.tsv" recovery.png "crash -> every rank of the new attempt at each point (last rank, median)"
fi

# Memory: summed PSS (/proc/<pid>/smaps_rollup) of 4 workers that imported torch, warm vs cold;
# the template's own PSS is shown beside the warm sum (it holds its share of the same pages).
cat >"$TMP/mem.py" <<'EOF'
import os, sys, time
import torch
marks = sys.argv[1]
with open(os.path.join(marks, "pid.%s" % os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
deadline = time.time() + 300
while not os.path.exists(os.path.join(marks, "go")) and time.time() < deadline:
    time.sleep(0.05)
EOF
# Pss of a process in KiB: $2 = Pss (all), Pss_Anon (its anonymous memory: heap, relocated
# library data; what a fork shares) or Pss_File (library and file pages: page cache).
pss_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
memory() {
  local kind=$1 n=$2 pid i rd f k
  local -A sum=([Pss]=0 [Pss_Anon]=0 [Pss_File]=0) tpl=([Pss]=0 [Pss_Anon]=0 [Pss_File]=0)
  rm -f "$MARKS"/*
  PYTHON_EXEC="$PYTHON" timeout 600 "$RDRUN" --warm-start "$kind" --standalone \
    --nproc-per-node "$n" "$TMP/mem.py" "$MARKS" >"$TMP/out" 2>"$TMP/err" &
  rd=$!
  for ((i = 0; i < 6000; i++)); do
    [ "$(ls "$MARKS" | grep -c '^pid\.')" = "$n" ] && break
    sleep 0.05
  done
  sleep 1
  for k in Pss Pss_Anon Pss_File; do
    for f in "$MARKS"/pid.*; do sum[$k]=$((sum[$k] + $(pss_kib "$(cat "$f")" $k))); done
  done
  if [ "$kind" = on ]; then
    # $rd is timeout(1); rdrun is its child and the template rdrun's.
    for pid in $(for c in $(cat /proc/$rd/task/*/children 2>/dev/null); do cat /proc/$c/task/*/children 2>/dev/null; done); do
      if grep -q "#rdrun warm template" "/proc/$pid/cmdline" 2>/dev/null; then
        for k in Pss Pss_Anon Pss_File; do tpl[$k]=$((tpl[$k] + $(pss_kib "$pid" $k))); done
      fi
    done
  fi
  touch "$MARKS/go"
  wait "$rd" || true
  echo "$((sum[Pss] / 1024)) $((tpl[Pss] / 1024)) $(((sum[Pss_Anon] + tpl[Pss_Anon]) / 1024)) $(((sum[Pss_File] + tpl[Pss_File]) / 1024))"
}
if [[ " ${PARTS:-recovery memory} " == *" memory "* ]]; then
  echo
  for n in ${MEM_SIZES:-4 8}; do
    read -r cold_w _ cold_a cold_f <<<"$(memory off "$n")"
    read -r warm_w warm_t warm_a warm_f <<<"$(memory on "$n")"
    printf '%s workers\trdrun cold\t%s\n%s workers\trdrun warm (template counted)\t%s\n' \
      "$n" "$cold_w" "$n" "$((warm_w + warm_t))" >>"$TMP/plot.memory.tsv"
    echo "memory, $n workers after import torch, summed PSS: cold $cold_w MiB (anon $cold_a, file $cold_f); warm $warm_w MiB + the template's $warm_t MiB = $((warm_w + warm_t)) MiB (anon $warm_a, file $warm_f), $(awk -v w=$((warm_w + warm_t)) -v c="$cold_w" 'BEGIN {printf "%.2f", w / c}')x of cold"
  done
  plot "$TMP/plot.memory.tsv" memory.png "summed PSS of the workers after import torch (warm: with the template's)" MiB
fi
