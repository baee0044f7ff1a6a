# shellcheck shell=bash
# The memory and cost parts of scripts/bench-recovery.sh (sourced by it, never run: it uses
# its TMP, MARKS, RDRUN, TORCHRUN, PYTHON, RUNS, PARTS, kinds and helpers).
#
# memory: launch time and summed PSS of MEM_SIZES ranks that import torch, for rdrun with no
#   flag on a first run (empty memory folder: the workers import torch themselves while the
#   template learns it), with no flag on the next run (the list an untimed warm-up run
#   remembered: the template imports torch before the first fork), `--warm-start on`,
#   `--warm-start off` (cold) and torchrun. PSS is taken 1 s after every rank is past
#   `import torch`, the template's counted (every warm kind); for the first run, the template's
#   again once it learned torch. Launch: rdrun (torchrun) started -> every rank past
#   `import torch`.
# cost: the learned preload's cost to a running job: steps/s of a 2-rank gloo CPU DDP job
#   (COST_LAYERS Linear(COST_WIDTH) layers, batch 64) over the window from DDP's construction
#   + 1 s to + 10 s, a first run under the default (the template learns what DDP's constructor
#   imports in that window, paced when the node has no core to spare) vs the same job with
#   `--warm-start off` (no template at all).

cat >"$TMP/mem.py" <<'EOF'
import os, sys, time
import torch
t = time.time_ns()
marks, rank = sys.argv[1], os.environ["RANK"]
with open(os.path.join(marks, "imp.%s" % rank), "w") as f:
    f.write("%d\n" % t)
with open(os.path.join(marks, "pid.%s" % rank), "w") as f:
    f.write(str(os.getpid()))
deadline = time.time() + 300
while not os.path.exists(os.path.join(marks, "go")) and time.time() < deadline:
    time.sleep(0.05)
EOF
# Pss of a process in KiB: $2 = Pss (all), Pss_Anon (its anonymous memory: heap, relocated
# library data; what a fork shares) or Pss_File (library and file pages: page cache).
pss_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
# The template(s) under launcher pid $1 (timeout, whose child is rdrun, whose child they are).
templates() {
  local c pid
  # shellcheck disable=SC2013 # (the children files are lists of words: pids)
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    for pid in $(cat /proc/"$c"/task/*/children 2>/dev/null); do
      grep -q "#rdrun warm template" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
    done
  done
  return 0
}
# Whether memory folder $1 holds a list with torch in it.
learned_torch() { grep -qs '"torch"' "$1"/*.json; }

# mem_one KIND N [MEMORY] -> "launch_s workers_MiB template_MiB anon_MiB file_MiB" and, for
# first: " template_after_learning_MiB learned_after_s"
mem_one() {
  local kind=$1 n=$2 memory=${3:-off} rd pid i f k t0 launch cmd
  local -A sum=([Pss]=0 [Pss_Anon]=0 [Pss_File]=0)
  rm -f "$MARKS"/*
  case $kind in
    cold) cmd=("$RDRUN" --warm-start off) ;; on) cmd=("$RDRUN" --warm-start on) ;;
    first | remembered) cmd=("$RDRUN") ;; torchrun) cmd=("$TORCHRUN") ;;
  esac
  t0=$(date +%s%N)
  PYTHON_EXEC="$PYTHON" RDRUN_WARM_MEMORY="$memory" timeout 600 "${cmd[@]}" --standalone \
    --nproc-per-node "$n" "$TMP/mem.py" "$MARKS" >"$TMP/out" 2>"$TMP/err" &
  rd=$!
  for ((i = 0; i < 6000; i++)); do
    [ "$(find "$MARKS" -name 'pid.*' | wc -l)" = "$n" ] && break
    sleep 0.05
  done
  launch=$(cat "$MARKS"/imp.* | awk -v t="$t0" '$1 > m {m = $1} END {printf "%.3f", (m - t) / 1e9}')
  sleep 1
  # (A trial child of the template, if one is importing at that moment, is not counted.)
  local pids=() tpl=()
  for f in "$MARKS"/pid.*; do pids+=("$(cat "$f")"); done
  mapfile -t tpl < <(templates "$rd")
  for k in Pss Pss_Anon Pss_File; do
    for pid in "${pids[@]}" "${tpl[@]}"; do sum[$k]=$((sum[$k] + $(pss_kib "$pid" $k))); done
  done
  local w=0 t=0
  for pid in "${pids[@]}"; do w=$((w + $(pss_kib "$pid" Pss))); done
  for pid in "${tpl[@]}"; do t=$((t + $(pss_kib "$pid" Pss))); done
  local extra=""
  if [ "$kind" = first ]; then
    # Until the template learned torch (its list remembered), then its PSS again.
    for ((i = 0; i < 1800; i++)); do learned_torch "$memory" && break; sleep 0.1; done
    local after=0
    if learned_torch "$memory"; then
      for pid in $(templates "$rd"); do after=$((after + $(pss_kib "$pid" Pss))); done
      extra=" $((after / 1024)) $(awk -v t="$t0" -v now="$(date +%s%N)" 'BEGIN {printf "%.1f", (now - t) / 1e9}')"
    else
      extra=" nan nan"
    fi
  fi
  touch "$MARKS/go"
  wait "$rd" || echo "bench-recovery: note: a $kind memory run with $n ranks failed" >&2
  echo "$launch $((w / 1024)) $((t / 1024)) $((sum[Pss_Anon] / 1024)) $((sum[Pss_File] / 1024))$extra"
}

if [[ " $PARTS " == *" memory "* ]]; then
  mem_kinds=(cold first remembered on)
  [ -x "$TORCHRUN" ] && mem_kinds+=(torchrun)
  echo
  loadavg
  # The warm-up of "remembered": a first run, untimed, until its template learned torch.
  MEM_SIZES="${MEM_SIZES:-4 8}"
  mem_one first "${MEM_SIZES%% *}" "$TMP/memory.mem" >/dev/null
  for n in ${MEM_SIZES:-4 8}; do
    for ((r = 0; r < RUNS; r++)); do
      for kind in "${mem_kinds[@]}"; do
        case $kind in
          first) mem_one first "$n" "$TMP/memory.first.$n.$r" ;;
          remembered)
            cp -r "$TMP/memory.mem" "$TMP/memory.rem.$n.$r"
            mem_one remembered "$n" "$TMP/memory.rem.$n.$r" ;;
          *) mem_one "$kind" "$n" ;;
        esac >>"$TMP/mem.$kind.$n"
      done
    done
  done
  echo
  loadavg
  # mcol C FILE: the median of column C.
  mcol() { awk -v c="$1" '{print $c}' "$2" | median; }
  declare -A launch total
  for n in ${MEM_SIZES:-4 8}; do
    echo
    echo "memory and launch, $n ranks importing torch (medians; MiB of summed PSS, template counted)"
    printf '%-21s %9s %8s %9s %7s %7s %7s %11s\n' launcher "launch s" workers template total anon file "total/cold"
    for kind in "${mem_kinds[@]}"; do
      launch[$kind]=$(mcol 1 "$TMP/mem.$kind.$n")
      total[$kind]=$(awk '{print $2 + $3}' "$TMP/mem.$kind.$n" | median)
      case $kind in
        cold) name="cold (off)" ;; first) name="no flag, first run" ;;
        remembered) name="no flag, remembered" ;; on) name="--warm-start on" ;; *) name=$kind ;;
      esac
      printf '%-21s %9s %8s %9s %7s %7s %7s %11s\n' "$name" "${launch[$kind]}" "$(mcol 2 "$TMP/mem.$kind.$n")" \
        "$(mcol 3 "$TMP/mem.$kind.$n")" "${total[$kind]}" "$(mcol 4 "$TMP/mem.$kind.$n")" \
        "$(mcol 5 "$TMP/mem.$kind.$n")" "$(ratio "${total[$kind]}" "${total[cold]}")"
      printf '%s workers\t%s\t%s\n' "$n" "$name" "${total[$kind]}" >>"$TMP/plot.memory.tsv"
    done
    after=$(awk '{print $2 + $6}' "$TMP/mem.first.$n" | median)
    echo "no flag, first run, once its template learned torch ($(mcol 7 "$TMP/mem.first.$n") s after launch):" \
      "template $(mcol 6 "$TMP/mem.first.$n") MiB, total $after MiB = $(ratio "$after" "${total[cold]}") of cold"
    line="launch ratios: cold/first $(ratio "${launch[cold]}" "${launch[first]}"), cold/remembered $(ratio "${launch[cold]}" "${launch[remembered]}")"
    [ -n "${launch[torchrun]:-}" ] && line+=", torchrun/first $(ratio "${launch[torchrun]}" "${launch[first]}"), torchrun/remembered $(ratio "${launch[torchrun]}" "${launch[remembered]}")"
    echo "$line"
    awk -v r="${total[remembered]}" -v c="${total[cold]}" 'BEGIN {
      printf "goal: summed PSS <= half of cold, template counted: remembered %.2f of cold (%s)\n", r / c, (r <= c / 2 ? "met" : "NOT met") }'
  done
  plot "$TMP/plot.memory.tsv" memory.png "summed PSS of the workers after import torch (warm: with the template's)" MiB
fi

cat >"$TMP/cost.py" <<'EOF'
import glob, json, os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
marks, width, layers, memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"])


def learned():
    # How many modules the template remembered by now (benchlearned.py, bench-recovery.sh).
    from benchlearned import remembered
    return remembered(memory)


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]))
t_ddp = time.time()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, width)
done, stop, at_start = [], torch.zeros(1), None
while True:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    now = time.time()
    if t_ddp + 1 < now <= t_ddp + 10:
        done.append(now)
        if at_start is None and rank == 0:
            at_start = learned()
    # Stopped together (rank 0 decides): a rank that left alone would hang its peer.
    stop[0] = float(now > t_ddp + 10)
    dist.broadcast(stop, 0)
    if stop[0]:
        break
if rank == 0:
    with open(os.path.join(marks, "cost"), "w") as f:
        f.write("%.2f %d %.1f %d\n" % (len(done) / 9.0, learned(), 9000.0 / max(len(done), 1), at_start or 0))
from benchlearned import end_cleanly
end_cleanly(dist)
EOF
# cost_one MEMORY -> "steps/s learned ms/step learned_at_start holds" (learned: modules in the
# remembered list at the window's end, at its start; holds: rdrun's log said "the template
# holds")
cost_one() {
  local memory=$1
  shift
  rm -f "$MARKS"/*
  PYTHON_EXEC="$PYTHON" RDRUN_WARM_MEMORY="$memory" RUST_LOG=warn,rdrun::supervisor::group::warm=info \
    timeout 600 "$RDRUN" --standalone --nproc-per-node 2 "$@" "$TMP/cost.py" "$MARKS" \
    "${COST_WIDTH:-1024}" "${COST_LAYERS:-3}" "$memory" >"$TMP/out" 2>"$TMP/err" ||
    { echo "bench-recovery: error: a cost run failed" >&2; tail -n 20 "$TMP/err" >&2; exit 1; }
  echo "$(cat "$MARKS/cost") $(grep -c 'the template holds' "$TMP/err" || true)"
}
if [[ " $PARTS " == *" cost "* ]]; then
  echo
  loadavg
  for ((r = 0; r < RUNS; r++)); do
    cost_one "$TMP/memory.cost.first.$r" >>"$TMP/cost.first"
    cost_one "$TMP/memory.cost.cold.$r" --warm-start off >>"$TMP/cost.cold"
  done
  loadavg
  echo
  echo "cost of learning to a running job: 2-rank gloo DDP, ${COST_LAYERS:-3} x Linear(${COST_WIDTH:-1024}), steps/s from DDP's construction + 1 s to + 10 s"
  printf '%-22s %9s %13s %9s %15s %22s\n' run "steps/s" "min-max" "ms/step" "learned (mods)" "\"the template holds\""
  for kind in first cold; do
    case $kind in
    first) name="no flag, first run" ;;
    cold) name="--warm-start off" ;;
    esac
    awk -v name="$name" '
      { s[NR] = $1; l[NR] = $2; ms[NR] = $3; l0[NR] = $4; h += ($5 > 0) }
      function med(a, n,  i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      END { n = NR; m = med(s, n); lo = s[1]; hi = s[n]
        printf "%-22s %9.2f %13s %9.1f %15s %22s\n", name, m, sprintf("%.2f-%.2f", lo, hi), med(ms, n),
          med(l0, n) " -> " med(l, n), h "/" n " runs" }' "$TMP/cost.$kind"
  done
  echo "(learned: modules in the remembered list at the window's start -> at its end, medians)"
  f=$(awk '{print $1}' "$TMP/cost.first" | median) cold=$(awk '{print $1}' "$TMP/cost.cold" | median)
  echo "first run / cold (steps/s): $(awk -v a="$f" -v b="$cold" 'BEGIN {printf "%.3f", a / b}') (the same job with no template at all)"
fi
