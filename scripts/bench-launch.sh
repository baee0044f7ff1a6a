#!/usr/bin/env bash
# Launcher benchmark: rdrun against torchrun, side by side, medians and ratios.
#   (a) launch of 4 `true` workers (`--standalone --nproc_per_node=4 --no-python true`):
#       wall time, CPU time (user+sys of the launcher and everything it started, from
#       getrusage through python3; on a busy machine wall time is mostly waiting for a CPU) and
#       peak RSS (largest single process of the run, from /usr/bin/time's %M);
#   (b) extra wall time of one failure plus restart: rank 1 fails on attempt 0 with
#       `--max-restarts=1`. Measured inside the run, where launcher start-up noise (torchrun's
#       Python imports) cannot blur it: from the moment the failing worker exits to the moment
#       the first worker of attempt 1 starts (both timestamps taken by the workers with `date`).
#       The whole run's wall time, with and without the failure, is printed too.
# Usage: scripts/bench-launch.sh   (env: RUNS_RDRUN=30, RUNS_TORCH=5, TORCHRUN=path, RDRUN=path)
# rdrun is built in release mode (launcher only); torchrun comes from the cached venv that
# scripts/torch-venv.sh installs (skipped, with a note, when it is absent).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS_RDRUN="${RUNS_RDRUN:-30}"
RUNS_TORCH="${RUNS_TORCH:-5}"
CACHE="${RDRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdrun}"
TORCHRUN="${TORCHRUN:-$CACHE/torch-venv/bin/torchrun}"

if [ -z "${RDRUN:-}" ]; then
  cargo build --release --no-default-features --bin rdrun >&2
  RDRUN="$PWD/target/release/rdrun"
fi
TIME_BIN=/usr/bin/time
if [ ! -x "$TIME_BIN" ]; then
  echo "bench-launch: error: /usr/bin/time (GNU time) is needed for peak RSS" >&2
  exit 1
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# Worker for (b): with FAIL=1, rank 1 records the time and fails on attempt 0; every worker of
# attempt 1 records its start time.
FAILER='if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then date +%s%N > "$BENCH_DIR/start.$LOCAL_RANK"; fi
if [ "${FAIL:-0}" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then
  date +%s%N > "$BENCH_DIR/fail"; exit 1
fi
exit 0'
export BENCH_DIR="$TMP/marks"
mkdir -p "$BENCH_DIR"

now_ns() { date +%s%N; }

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# measure RUNS LAUNCHER [ARGS...] -> prints "median_wall_s median_rss_kib median_restart_gap_s"
measure() {
  local runs=$1; shift
  local walls=() rsss=() gaps=() i t0 t1 first
  for ((i = 0; i < runs; i++)); do
    rm -f "$BENCH_DIR"/*
    t0=$(now_ns)
    if ! "$TIME_BIN" -f '%M' -o "$TMP/rss" "$@" >"$TMP/out" 2>"$TMP/err"; then
      echo "bench-launch: error: run failed: $*" >&2
      tail -n 20 "$TMP/err" >&2
      exit 1
    fi
    t1=$(now_ns)
    walls+=("$(( (t1 - t0) / 1000 ))")
    rsss+=("$(tail -n 1 "$TMP/rss")")
    if [ -f "$BENCH_DIR/fail" ]; then
      first=$(cat "$BENCH_DIR"/start.* | sort -n | head -n 1)
      gaps+=("$(( (first - $(cat "$BENCH_DIR/fail")) / 1000 ))")
    else
      gaps+=(0)
    fi
  done
  local mw mr mg
  mw=$(printf '%s\n' "${walls[@]}" | median)
  mr=$(printf '%s\n' "${rsss[@]}" | median)
  mg=$(printf '%s\n' "${gaps[@]}" | median)
  awk -v w="$mw" -v r="$mr" -v g="$mg" 'BEGIN {printf "%.6f %.0f %.6f\n", w / 1e6, r, g / 1e6}'
}

launch_args=(--standalone --nproc_per_node=4 --no-python)

# cpu RUNS LAUNCHER [ARGS...] -> median CPU seconds (user+sys, children included) per run.
cpu() {
  if ! command -v python3 >/dev/null; then echo 0; return; fi
  python3 - "$@" <<'PY'
import resource, subprocess, sys
runs, cmd = int(sys.argv[1]), sys.argv[2:]
def used():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
samples = []
for _ in range(runs):
    before = used()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    samples.append(used() - before)
samples.sort()
n = len(samples)
print("%.6f" % (samples[n // 2] if n % 2 else (samples[n // 2 - 1] + samples[n // 2]) / 2))
PY
}

echo "== rdrun: $RDRUN ($RUNS_RDRUN runs each)"
read -r r_wall r_rss _ < <(measure "$RUNS_RDRUN" "$RDRUN" "${launch_args[@]}" true)
r_cpu=$(cpu "$RUNS_RDRUN" "$RDRUN" "${launch_args[@]}" true)
read -r r_ok _ _ < <(FAIL=0 measure "$RUNS_RDRUN" "$RDRUN" "${launch_args[@]}" --max-restarts=1 sh -c "$FAILER")
read -r r_fail _ r_restart < <(FAIL=1 measure "$RUNS_RDRUN" "$RDRUN" "${launch_args[@]}" --max-restarts=1 sh -c "$FAILER")

have_torch=0
if [ -x "$TORCHRUN" ]; then
  have_torch=1
  echo "== torchrun: $TORCHRUN ($RUNS_TORCH runs each)"
  read -r t_wall t_rss _ < <(measure "$RUNS_TORCH" "$TORCHRUN" "${launch_args[@]}" true)
  t_cpu=$(cpu "$RUNS_TORCH" "$TORCHRUN" "${launch_args[@]}" true)
  read -r t_ok _ _ < <(FAIL=0 measure "$RUNS_TORCH" "$TORCHRUN" "${launch_args[@]}" --max-restarts=1 sh -c "$FAILER")
  read -r t_fail _ t_restart < <(FAIL=1 measure "$RUNS_TORCH" "$TORCHRUN" "${launch_args[@]}" --max-restarts=1 sh -c "$FAILER")
else
  echo "== torchrun not found at $TORCHRUN (run scripts/torch-venv.sh); rdrun only"
fi

echo
echo "host: $(nproc) CPUs, $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-40s %14s %14s %10s\n' "metric (median)" "rdrun" "torchrun" "ratio"
row() { # name rdrun torchrun unit scale
  if [ "$have_torch" = 1 ]; then
    awk -v n="$1" -v a="$2" -v b="$3" -v u="$4" -v s="$5" 'BEGIN {
      printf "%-40s %12.*f%s %12.*f%s %9.1fx\n", n, 3, a * s, u, 3, b * s, u, (a > 0 ? b / a : 0) }'
  else
    awk -v n="$1" -v a="$2" -v u="$4" -v s="$5" 'BEGIN { printf "%-40s %12.*f%s %14s %10s\n", n, 3, a * s, u, "-", "-" }'
  fi
}
row "(a) launch 4 x true, wall" "$r_wall" "${t_wall:-0}" " s" 1
row "(a) launch 4 x true, CPU user+sys" "$r_cpu" "${t_cpu:-0}" " s" 1
row "(a) launch 4 x true, peak RSS" "$r_rss" "${t_rss:-0}" " M" "$(awk 'BEGIN {print 1/1024}')"
row "(b) run without failure, wall" "$r_ok" "${t_ok:-0}" " s" 1
row "(b) run with one failure + restart, wall" "$r_fail" "${t_fail:-0}" " s" 1
row "(b) restart gap: failure -> attempt 1" "$r_restart" "${t_restart:-0}" " s" 1
