#!/usr/bin/env bash
# The agent at a large local world (issue 16): `--standalone --nproc-per-node N` of `sleep`
# workers, rdrun and torchrun side by side. For each launcher: the time until all N workers
# exist (spawn), the launcher's own CPU while it supervises them for AGENT_SECS (utime + stime
# of the launcher process from /proc, as % of one core), and the time from SIGTERM to the
# launcher's exit with every worker reaped (stop). One key=value line per launcher to
# $AGENT_OUT/results.txt, with the load average at the start of each run (the machine may be
# shared: read the figures with it).
# Env: AGENT_NPROC (default 256), AGENT_SECS (default 60), AGENT_OUT (default
#      target/bench-agent), AGENT_SKIP_TORCH=1, AGENT_RDRUN (a built rdrun; default: build
#      release), AGENT_HANG_OFF=1 (also each rdrun with RDRUN_HANG_DETECT=off, the agent without
#      its hang monitor), AGENT_BASE (another built rdrun, e.g. an earlier commit's, measured in
#      the same run as `rdrun-base`, each run just before the current one's).
set -euo pipefail
cd "$(dirname "$0")/.."

N="${AGENT_NPROC:-256}"
SECS="${AGENT_SECS:-60}"
OUT="${AGENT_OUT:-target/bench-agent}"
mkdir -p "$OUT"
RESULTS="$OUT/results.txt"
: >"$RESULTS"
RDRUN="${AGENT_RDRUN:-}"
if [ -z "$RDRUN" ]; then
  cargo build --release --quiet --no-default-features --bin rdrun
  RDRUN=target/release/rdrun
fi
PY=""
if [ -z "${AGENT_SKIP_TORCH:-}" ]; then PY="$(scripts/torch-venv.sh | tail -n 1)"; fi
HZ="$(getconf CLK_TCK)"
LPID=""
cleanup() { if [ -n "$LPID" ]; then kill -KILL "$LPID" 2>/dev/null || true; wait "$LPID" 2>/dev/null || true; fi; }
trap cleanup EXIT

now() { date +%s.%N; }
cpu_ticks() { # pid -> utime+stime of that process (ticks)
  awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
descendants() { # pid -> number of live processes below it (any depth)
  local n=0 kids k
  kids=$(cat /proc/"$1"/task/*/children 2>/dev/null || true)
  for k in $kids; do n=$((n + 1 + $(descendants "$k"))); done
  echo "$n"
}
sleepers() { # pid -> number of `sleep` processes below it
  local n=0 kids k
  kids=$(cat /proc/"$1"/task/*/children 2>/dev/null || true)
  for k in $kids; do
    if [ "$(cat /proc/"$k"/comm 2>/dev/null)" = sleep ]; then n=$((n + 1)); fi
    n=$((n + $(sleepers "$k")))
  done
  echo "$n"
}

run_one() { # name cmd...
  local name=$1; shift
  local load; load="$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/')"
  local t0; t0=$(now)
  "$@" >"$OUT/$name.log" 2>&1 &
  LPID=$!
  local spawn=unfinished
  for _ in $(seq 1 1800); do
    if [ "$(sleepers "$LPID")" -ge "$N" ]; then spawn=$(echo "$(now) - $t0" | bc); break; fi
    if ! kill -0 "$LPID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [ "$spawn" = unfinished ]; then
    echo "kind=agent launcher=$name nproc=$N spawn_s=unfinished load=$load" | tee -a "$RESULTS"
    kill -KILL "$LPID" 2>/dev/null || true; wait "$LPID" 2>/dev/null || true; LPID=""
    return
  fi
  sleep 2 # let the start-up settle
  local c0; c0=$(cpu_ticks "$LPID")
  local s0; s0=$(now)
  sleep "$SECS"
  local c1; c1=$(cpu_ticks "$LPID")
  local s1; s1=$(now)
  local pct; pct=$(echo "scale=3; 100 * ($c1 - $c0) / $HZ / ($s1 - $s0)" | bc)
  local t1; t1=$(now)
  kill -TERM "$LPID"
  wait "$LPID" 2>/dev/null || true
  local stop; stop=$(echo "$(now) - $t1" | bc)
  LPID=""
  # Nothing of the run may be left (every worker reaped).
  local left; left=$(pgrep -c -f "^sleep 100000$" || true)
  echo "kind=agent launcher=$name nproc=$N spawn_s=$spawn supervise_cpu_pct=$pct" \
    "supervise_s=$(echo "$s1 - $s0" | bc) stop_s=$stop workers_left=$left load=$load" | tee -a "$RESULTS"
}

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/machine.txt"
rdrun_one() { # name binary on|off (hang detection)
  if [ "$3" = off ]; then
    run_one "$1-hang-off" env RDRUN_HANG_DETECT=off "$2" --standalone --nproc-per-node "$N" \
      --no-python sleep 100000
  else
    run_one "$1" "$2" --standalone --nproc-per-node "$N" --no-python sleep 100000
  fi
}
for hang in on ${AGENT_HANG_OFF:+off}; do
  if [ -n "${AGENT_BASE:-}" ]; then rdrun_one rdrun-base "$AGENT_BASE" "$hang"; fi
  rdrun_one rdrun "$RDRUN" "$hang"
done
if [ -n "$PY" ]; then
  run_one torchrun "$PY" -m torch.distributed.run --standalone --nproc-per-node "$N" \
    --no-python sleep 100000
fi
echo "results: $RESULTS"
