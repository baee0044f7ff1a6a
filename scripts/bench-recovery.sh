#!/usr/bin/env bash
# Recovery benchmark (issues 27 and 37): how long a real gloo DDP job loses per failure, rdrun with no
# flag (the default `--warm-start auto`: the template learns what the workers import), rdrun
# `--warm-start on`, rdrun cold and torchrun, side by side.
#   The job: NPROC ranks train a small DDP model (0.05 s sleep per step); on attempt 0 rank 1
#   dies (os._exit) at the first step boundary at least CRASH_AFTER s after its first step (as
#   a real job trains a while before it fails: the default's template learns meanwhile), the
#   other ranks keep stepping, `--max-restarts 1`. Every rank of attempt 1 writes time stamps
#   (time.time_ns) when its script starts, when `import torch` is done, when the process group
#   is ready and when its first training step is done. Reported per point: crash -> the LAST
#   rank to reach it (medians over RUNS runs), and the ratios cold/default and torchrun/default.
#   Columns (KINDS):
#     default     no flag, a first run: RDRUN_WARM_MEMORY is an empty folder of its own, so the
#                 template starts bare and learns during attempt 0
#     remembered  no flag, the next run of the same script: RDRUN_WARM_MEMORY is a copy of the
#                 folder an untimed warm-up run of the same job filled (the template imports the
#                 remembered list before the first fork)
#     warm        --warm-start on (torch imported before the first fork; learns the rest)
#     warmplus    on + `--preload` of what DDP's constructor imports lazily (PRELOAD)
#     cold        --warm-start off; torchrun: torchrun
#   (warm, warmplus and cold run with RDRUN_WARM_MEMORY=off: no state across runs.)
#   The template's own start-up (once per run) is printed from rdrun's log.
# PARTS: recovery (above), memory and cost (scripts/bench-recovery-parts.sh: launch time and
#   summed PSS of 4 and 8 ranks importing torch; the learned preload's cost to a running job).
# Usage: scripts/bench-recovery.sh   (env: RUNS=3, SIZES="2 4", PARTS="recovery memory cost",
#        KINDS="default remembered warmplus cold torchrun", CRASH_AFTER=8, MEM_SIZES="4 8",
#        COST_WIDTH=1024, COST_LAYERS=3, PRELOAD=mods, TORCHRUN=path, RDRUN=path, PYTHON=path,
#        PLOTS=folder (recovery.png and memory.png drawn there); rdrun is built in release mode
#        unless RDRUN is given)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
SIZES="${SIZES:-2 4}"
PARTS="${PARTS:-recovery memory cost}"
CRASH_AFTER="${CRASH_AFTER:-8}"
# "No flag" must mean rdrun's default, whatever the caller's environment says.
unset RDRUN_WARM_START RDRUN_PRELOAD
# shellcheck source=scripts/bench-torch-lib.sh
. scripts/bench-torch-lib.sh bench-recovery

# Shared by the jobs (next to them: their sys.path[0]): how many modules the
# template's remembered list in a RDRUN_WARM_MEMORY folder names.
cat >"$TMP/benchlearned.py" <<'EOF'
import glob, json, os


def remembered(memory):
    n = 0
    for p in glob.glob(os.path.join(memory, "*.json")):
        try:
            with open(p) as f:
                n = max(n, len(json.load(f)["modules"]))
        except (OSError, ValueError, KeyError):
            pass
    return n


def end_cleanly(dist):
    # No interpreter finalisation: torch 2.15's gloo teardown race
    # (launcher-tests/torch/README.md).
    import sys
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
EOF
cat >"$TMP/job.py" <<'EOF'
import os, sys, time
t_start = time.time_ns()
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
marks, crash_after, memory = sys.argv[1], float(sys.argv[2]), sys.argv[3]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])


def mark(*points):
    # One line per point reached, written at once: a rank that dies later keeps what it reached.
    if attempt == 1:
        with open(os.path.join(marks, "a1.%d" % rank), "a") as f:
            for name, t in points:
                f.write("%s %d\n" % (name, t))


def learned():
    # How many modules the template remembered by now (benchlearned.py, bench-recovery.sh).
    from benchlearned import remembered
    return remembered(memory)


mark(("start", t_start), ("import", time.time_ns()))
dist.init_process_group("gloo")
mark(("pg", time.time_ns()))
torch.manual_seed(0)
model = DDP(nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step, t_first = 0, None
while attempt == 0 or step < 3:
    # Attempt 0: rank 1 dies at a step boundary, CRASH_AFTER s after its first step at least;
    # the others keep stepping (and fail in the collective, or are stopped).
    if attempt == 0 and rank == 1 and step >= 5 and time.time() - t_first >= crash_after:
        if memory != "-":
            with open(os.path.join(marks, "learned"), "w") as f:
                f.write(str(learned()))
        with open(os.path.join(marks, "crash"), "w") as f:
            f.write(str(time.time_ns()))
        os._exit(7)
    opt.zero_grad()
    model(torch.randn(32, 64)).pow(2).sum().backward()
    opt.step()
    if step == 0:
        t_first = time.time()
        mark(("step", time.time_ns()))
    time.sleep(0.05)
    step += 1
from benchlearned import end_cleanly
end_cleanly(dist)
EOF

# launcher KIND MEMORY: sets `cmd` (the launcher's command line) and `envs` (its variables) for
# a kind; MEMORY: the RDRUN_WARM_MEMORY folder of the no-flag kinds.
launcher() {
  case $1 in
    default | remembered) cmd=("$RDRUN") ;;
    warm) cmd=("$RDRUN" --warm-start on) ;;
    warmplus) cmd=("$RDRUN" --warm-start on --preload "$PRELOAD") ;;
    cold) cmd=("$RDRUN" --warm-start off) ;;
    torchrun) cmd=("$TORCHRUN") ;;
  esac
  # "-" (run_one's "no folder") means no memory: never a folder named "-" in the working
  # directory.
  local memory=${2:--}
  [ "$memory" = - ] && memory=off
  envs=(PYTHON_EXEC="$PYTHON" RDRUN_WARM_MEMORY="$memory")
}

# run_one NPROC KIND [MEMORY] -> appends "start import pg step" (seconds after the crash, last
# rank) to $TMP/res.KIND.NPROC; without a result file when KIND is "warmup".
run_one() {
  local n=$1 kind=$2 memory=${3:--} cmd envs
  rm -f "$MARKS"/*
  launcher "${kind/warmup/default}" "$memory"
  if ! env "${envs[@]}" RUST_LOG=rdrun=info timeout 600 "${cmd[@]}" --standalone \
      --nproc-per-node "$n" --max-restarts 1 "$TMP/job.py" "$MARKS" "$CRASH_AFTER" "$memory" \
      >"$TMP/out" 2>"$TMP/err"; then
    # torchrun 2.15's attempt 1 may die in gloo's connectFullMesh (it reads attempt 0's
    # addresses from the store it did not clear): the points it reached still count.
    echo "bench-recovery: note: a $kind run with $n ranks failed; points not reached show as -" >&2
  fi
  if [ ! -f "$MARKS/crash" ]; then
    echo "bench-recovery: error: the $kind run with $n ranks never crashed" >&2
    tail -n 20 "$TMP/err" >&2
    exit 1
  fi
  [ "$kind" = warmup ] && return
  grep -o 'template interpreter pid [0-9]* ready in [0-9.]* s' "$TMP/err" \
    | awk '{print $(NF-1)}' >>"$TMP/template.$kind.$n" || true
  cat "$MARKS/learned" >>"$TMP/learned.$kind.$n" 2>/dev/null && echo >>"$TMP/learned.$kind.$n"
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

label() {
  case $1 in
    default) echo "no flag" ;; remembered) echo remembered ;; warm) echo "on" ;;
    warmplus) echo "on+preload" ;; *) echo "$1" ;;
  esac
}
has() { [[ " ${kinds[*]} " == *" $1 "* ]]; }
loadavg() { echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $RUNS runs each"; }
# f X: a number as %.3f, or - for nan; ratio X Y: X/Y as 1.2x, or -.
f() { awk -v x="$1" 'BEGIN { print (x == "nan" || x == "") ? "-" : sprintf("%.3f", x) }'; }
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { print (x == "nan" || y == "nan" || x == "" || y == "" || y <= 0) ? "-" : sprintf("%.1fx", x / y) }'; }
med() { if [ -s "$1" ]; then median <"$1"; else echo nan; fi; }
# The median of column $1 over the runs that reached the point (nan when none did).
col() { if [ -f "$2" ]; then awk -v c="$1" '$c != "nan" {print $c}' "$2" | median; else echo nan; fi; }

PRELOAD="${PRELOAD:-torch._dynamo,torch._inductor,torch.onnx}"
read -r -a kinds <<<"${KINDS:-default remembered warmplus cold torchrun}"
if has torchrun && [ ! -x "$TORCHRUN" ]; then
  echo "bench-recovery: no torchrun at $TORCHRUN; skipped" >&2
  read -r -a kinds <<<"$(printf '%s\n' "${kinds[@]}" | grep -vx torchrun | tr '\n' ' ')"
fi

if [[ " $PARTS " == *" recovery "* ]]; then
loadavg
if has remembered; then
  # The warm-up: the same job, once, untimed; every remembered run starts from a copy of it.
  run_one "${SIZES%% *}" warmup "$TMP/memory.recovery"
  ls "$TMP/memory.recovery"/*.json >/dev/null 2>&1 ||
    echo "bench-recovery: warning: the warm-up run remembered nothing" >&2
fi
for n in $SIZES; do
  for ((r = 0; r < RUNS; r++)); do
    # Interleaved, so that a change in the machine's load hits every launcher alike.
    for kind in "${kinds[@]}"; do
      case $kind in
        default) run_one "$n" "$kind" "$TMP/memory.default.$n.$r" ;;
        remembered)
          cp -r "$TMP/memory.recovery" "$TMP/memory.remembered.$n.$r"
          run_one "$n" "$kind" "$TMP/memory.remembered.$n.$r" ;;
        *) run_one "$n" "$kind" ;;
      esac
    done
  done
done

echo
loadavg
echo "columns: no flag = the default on a first run (the template learns during attempt 0);"
echo "  remembered = the default on the next run of the same script; on = --warm-start on;"
echo "  on+preload = on --preload $PRELOAD; cold = --warm-start off. Attempt 0 trains ${CRASH_AFTER} s."
for n in $SIZES; do
  echo
  echo "$n ranks: crash -> every rank of attempt 1 at each point (median seconds)"
  printf '%-20s' point
  for kind in "${kinds[@]}"; do printf ' %11s' "$(label "$kind")"; done
  printf ' %12s %15s\n' "cold/no flag" "torchrun/no flag"
  i=0
  for point in "process started" "import torch done" "process group ready" "first step done"; do
    i=$((i + 1))
    printf '%-20s' "$point"
    for kind in "${kinds[@]}"; do
      v=$(col $i "$TMP/res.$kind.$n")
      printf ' %11s' "$(f "$v")"
      printf '%s ranks: %s\t%s\t%s\n' "$n" "$point" "$(label "$kind")" "$v" >>"$TMP/plot.recovery.tsv"
    done
    d=$(col $i "$TMP/res.default.$n")
    printf ' %12s %15s\n' "$(ratio "$(col $i "$TMP/res.cold.$n")" "$d")" "$(ratio "$(col $i "$TMP/res.torchrun.$n")" "$d")"
  done
  line="template start-up (once per run, before attempt 0):"
  for kind in default remembered warm warmplus; do
    has "$kind" && line+=" $(label "$kind") $(med "$TMP/template.$kind.$n") s;"
  done
  echo "${line%;}"
  for kind in default remembered; do
    has "$kind" && echo "$(label "$kind"): modules the template remembered by the crash (median): $(med "$TMP/learned.$kind.$n")"
  done
  if has default && has cold; then
    d=$(col 4 "$TMP/res.default.$n") c=$(col 4 "$TMP/res.cold.$n")
    awk -v d="$d" -v c="$c" -v n="$n" 'BEGIN {
      if (d == "nan" || c == "nan") { print "goal: not measured"; exit }
      printf "goal (issue 37): crash -> first step of attempt 1 with no flags <= 0.3 s and >= 10x less than cold: %.3f s (%s), %.1fx (%s)\n",
        d, (d <= 0.3 ? "met" : "NOT met"), c / d, (c / d >= 10 ? "met" : "NOT met") }'
  fi
done
plot "$TMP/plot.recovery.tsv" recovery.png "crash -> every rank of the new attempt at each point (last rank, median)"
fi

if [[ " $PARTS " == *" memory "* || " $PARTS " == *" cost "* ]]; then
  # shellcheck source=scripts/bench-recovery-parts.sh
  . scripts/bench-recovery-parts.sh
fi
