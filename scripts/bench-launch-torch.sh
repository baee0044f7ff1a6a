#!/usr/bin/env bash
# Launch benchmark with torch (issue 27; scripts/bench-launch.sh is the launcher-only one):
# `--nproc_per_node=4` and `=8` of a script that imports torch and prints one line: launcher
# start -> every rank's first line, rdrun with warm start (workers forked from one template
# interpreter that imported torch once), rdrun cold (each worker imports torch itself) and
# torchrun, side by side, interleaved so that load changes hit every launcher alike.
#   Each rank writes time.time_ns() right after it printed its line; a cell is the LAST rank's
#   stamp minus the time the launcher was started (median of RUNS runs). The warm column includes
#   the template's own start-up (it imports torch before the first fork).
#   Output: a table and a text bar chart; with PLOTS=folder also launch-torch.png there.
# Usage: scripts/bench-launch-torch.sh   (env: RUNS=3, SIZES="4 8", TORCHRUN=path, RDRUN=path,
#        PYTHON=path, PLOTS=folder; rdrun is built in release mode unless RDRUN is given)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
SIZES="${SIZES:-4 8}"
# shellcheck source=scripts/bench-torch-lib.sh
. scripts/bench-torch-lib.sh bench-launch-torch

cat >"$TMP/hello.py" <<'EOF2'
import os, sys, time
import torch
print("rank %s: torch %s" % (os.environ["RANK"], torch.__version__), flush=True)
with open(os.path.join(sys.argv[1], "r%s" % os.environ["RANK"]), "w") as f:
    f.write(str(time.time_ns()))
EOF2

# run_one NPROC KIND: appends start -> last rank's first line (s) to $TMP/res.KIND.NPROC
run_one() {
  local n=$1 kind=$2 cmd start
  rm -f "$MARKS"/*
  case $kind in
    warm) cmd=("$RDRUN" --warm-start on) ;;
    cold) cmd=("$RDRUN" --warm-start off) ;;
    torchrun) cmd=("$TORCHRUN") ;;
  esac
  start=$(date +%s%N)
  if ! OMP_NUM_THREADS=1 PYTHON_EXEC="$PYTHON" timeout 600 "${cmd[@]}" --standalone \
      --nproc-per-node "$n" "$TMP/hello.py" "$MARKS" >"$TMP/out" 2>"$TMP/err"; then
    echo "bench-launch-torch: error: the $kind run with $n ranks failed" >&2
    tail -n 20 "$TMP/err" >&2
    exit 1
  fi
  if [ "$(grep -c '^rank [0-9]*: torch' "$TMP/out")" != "$n" ]; then
    echo "bench-launch-torch: error: the $kind run with $n ranks did not print $n lines" >&2
    exit 1
  fi
  # One stamp per file, no newline after it: awk reads each file as one record.
  awk -v s="$start" '{ if ($1 > m) m = $1 } END { printf "%.3f\n", (m - s) / 1e9 }' "$MARKS"/r* \
    >>"$TMP/res.$kind.$n"
}

kinds=(warm cold)
if [ -x "$TORCHRUN" ]; then kinds+=(torchrun); else echo "bench-launch-torch: no torchrun at $TORCHRUN; skipped" >&2; fi
for n in $SIZES; do
  for ((r = 0; r < RUNS; r++)); do
    for kind in "${kinds[@]}"; do run_one "$n" "$kind"; done
  done
done

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $RUNS runs each (median)"
echo "launcher start -> every rank's first line (after import torch)"
printf '%-6s %9s %9s %9s %10s %14s\n' ranks "warm" "cold" torchrun "cold/warm" "torchrun/warm"
for n in $SIZES; do
  w=$(median <"$TMP/res.warm.$n"); c=$(median <"$TMP/res.cold.$n"); t=nan
  [ -f "$TMP/res.torchrun.$n" ] && t=$(median <"$TMP/res.torchrun.$n")
  awk -v n="$n" -v w="$w" -v c="$c" -v t="$t" '
    function f(x) { return x == "nan" ? "-" : sprintf("%.2f s", x) }
    function r(x, y) { return (x == "nan" || y == "nan" || y <= 0) ? "-" : sprintf("%.1fx", x / y) }
    BEGIN { printf "%-6s %9s %9s %9s %10s %14s\n", n, f(w), f(c), f(t), r(c, w), r(t, w) }'
done
echo
# A text bar chart: one '#' per 0.5 s.
for n in $SIZES; do
  for kind in "${kinds[@]}"; do
    v=$(median <"$TMP/res.$kind.$n")
    awk -v n="$n" -v k="$kind" -v v="$v" 'BEGIN {
      b = ""; for (i = 0; i < v / 0.5; i++) b = b "#"; printf "%2s ranks %-9s %6.2f s %s\n", n, k, v, b }'
    printf '%s ranks\t%s\t%s\n' "$n" "$kind" "$v" >>"$TMP/plot.tsv"
  done
done
plot "$TMP/plot.tsv" launch-torch.png "launcher start -> every rank's first line after import torch (last rank)"
