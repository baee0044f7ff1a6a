#!/usr/bin/env bash
# Time of the network pre-check at rendezvous (issue 28 item 3) at 2, 4 and 8 simulated hosts
# (network namespaces on one bridge, scripts/netns.sh; root and iproute2 needed): a static job
# of `true` workers with `--network-check on`, each node's own "network check done took_ms"
# (from the round's end to its verdict), RUNS jobs per size: median and max over every node of
# every job. Then, as a correctness repeat beyond the launcher test's: SLOW_RUNS jobs of 4 hosts
# with host 2 rate-limited (tc tbf 20mbit) must each name exactly that host on every node, and
# SLOW_RUNS on an even network must name none.
# Usage: sudo scripts/bench-netcheck.sh   (env: RUNS=10, SLOW_RUNS=10, SIZES="2 4 8", RDRUN=path;
# default: a release build)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-10}"
SLOW_RUNS="${SLOW_RUNS:-10}"
SIZES="${SIZES:-2 4 8}"
if [ -z "${RDRUN:-}" ]; then
  cargo build --release --no-default-features --bin rdrun >&2
  RDRUN="$PWD/target/release/rdrun"
fi
scripts/netns.sh check >/dev/null || { scripts/netns.sh check; exit 77; }
TMP="$(mktemp -d)"
TAG="b$$"
cleanup() { scripts/netns.sh down "$TAG" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

PORT=29800
# One static job of $1 hosts; each node's log in $TMP/log.<i>.
job() {
  local n=$1 i pids=()
  PORT=$((PORT + 1))
  for ((i = 0; i < n; i++)); do
    RUST_LOG=info scripts/netns.sh exec "$TAG" "$i" timeout 120 "$RDRUN" --nnodes "$n" \
      --node-rank "$i" --master-addr 10.231.0.1 --master-port "$PORT" --network-check on \
      --no-python true >"$TMP/log.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a node failed:" >&2; cat "$TMP"/log.* >&2; exit 1; }; done
}

echo "rdrun: $RDRUN; $RUNS static jobs per size; each node's pre-check time (ms)"
for n in $SIZES; do
  RDRUN_NETNS_OWNER=$$ scripts/netns.sh up "$TAG" "$n"
  : >"$TMP/times"
  for _ in $(seq "$RUNS"); do
    job "$n"
    grep -ho 'network check done took_ms=[0-9]*' "$TMP"/log.* | sed 's/.*=//' >>"$TMP/times"
  done
  printf '%2d hosts: median %5s ms   max %5s ms   (%s measurements)\n' "$n" \
    "$(median <"$TMP/times")" "$(sort -n "$TMP/times" | tail -1)" "$(wc -l <"$TMP/times")"
  scripts/netns.sh down "$TAG"
done

RDRUN_NETNS_OWNER=$$ scripts/netns.sh up "$TAG" 4
named() { { grep -ho 'network check: node [0-9]* ([0-9.]*' "$TMP"/log.* || true; } | sed 's/.*(//' | sort | uniq -c; }
bad=0
for _ in $(seq "$SLOW_RUNS"); do
  job 4
  out=$(named)
  [ -z "$out" ] || { echo "even network named: $out"; bad=1; }
done
scripts/netns.sh slow "$TAG" 2 20mbit
for _ in $(seq "$SLOW_RUNS"); do
  job 4
  out=$(named | tr -s ' ')
  [ "$out" = " 4 10.231.0.3" ] || { echo "slow host 10.231.0.3 not named alone by all 4: $out"; bad=1; }
done
echo "4 hosts: $SLOW_RUNS even runs named nobody, $SLOW_RUNS runs with host 2 at 20mbit named it on every node: $([ $bad = 0 ] && echo yes || echo NO)"
exit $bad
