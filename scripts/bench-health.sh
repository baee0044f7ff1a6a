#!/usr/bin/env bash
# Cost of the node health checks on launch (issue 28): the same launch with
# `--health-check off` and `--health-check warn` (the default), alternated run by run, medians.
#   (a) 4 `true` workers (`--no-python`): every check but the interpreter's;
#   (b) 4 Python workers (`pass` as the script): the interpreter check runs too, and outlives
#       the job (rdrun waits for its verdict at the end);
#   (c) 4 Python workers that run 1 s: the interpreter check runs beside them (under `warn` the
#       checks never gate the launch), its verdict in before the job ends.
# Usage: scripts/bench-health.sh   (env: RUNS=30, RDRUN=path; default: a release build)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-30}"
if [ -z "${RDRUN:-}" ]; then
  cargo build --release --no-default-features --bin rdrun >&2
  RDRUN="$PWD/target/release/rdrun"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "pass" > "$TMP/w.py"
echo "import time; time.sleep(1)" > "$TMP/w1.py"

# Wall time of one launch in ms.
one() {
  local t0 t1
  t0=$(date +%s%N)
  "$RDRUN" --standalone --nproc-per-node=4 "$@" >/dev/null 2>&1
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

bench() {
  local name=$1; shift
  : > "$TMP/off"; : > "$TMP/warn"
  for _ in $(seq "$RUNS"); do
    one --health-check off "$@" >> "$TMP/off"
    one --health-check warn "$@" >> "$TMP/warn"
  done
  local off warn
  off=$(median < "$TMP/off"); warn=$(median < "$TMP/warn")
  printf '%-28s off %6s ms   warn %6s ms   cost %6s ms\n' "$name" "$off" "$warn" \
    "$(awk -v a="$warn" -v b="$off" 'BEGIN {print a - b}')"
}

echo "rdrun: $RDRUN, $RUNS runs each, median wall time of one launch"
bench "4 x true (--no-python)" --no-python true
bench "4 x python3 w.py" "$TMP/w.py"
bench "4 x python3 (1 s job)" "$TMP/w1.py"
# What the checks themselves report (one run): each check's own time.
"$RDRUN" --dry-run --nproc-per-node=4 "$TMP/w.py" 2>/dev/null | sed -n '/^Health checks/,$p'
