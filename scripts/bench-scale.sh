#!/usr/bin/env bash
# Scale benchmarks (issue 16), results in docs/benchmarks.md ("Scale"):
#   (a) the store under PyTorch's start-up pattern (rdrun-store-bench startup: connect +
#       VALIDATE, the init/ ADD, own-key SET, rank 0's shared SET that all GET, ADD + WAIT
#       barrier) at each size in SCALE_STORE_SIZES against a fresh rdrun server, and at each size
#       in SCALE_TORCH_SIZES against a fresh PyTorch libuv TCPStore server, in the same run;
#       capped at SCALE_CAP_S per run;
#   (b) the c10d rendezvous of SCALE_SIM_SIZES simulated nodes in one process (rdrun-rdzv-sim),
#       against a fresh rdrun store process: join time, store CPU during the join and at steady state,
#       detection of one lost node.
# Raw result lines go to $SCALE_OUT/results.txt (one key=value line per run); then
# scripts/plot-scale.py draws one log-log PNG per measure into $SCALE_OUT (matplotlib is
# installed into the PyTorch venv on demand).
# Env: SCALE_STORE_SIZES (default 1000,2000,4000,8000,16000,19000), SCALE_TORCH_SIZES (default
#      1000,2000), SCALE_SIM_SIZES (default 128,1000), SCALE_CAP_S (default 120), SCALE_OUT
#      (default target/bench-scale), SCALE_NO_PLOT=1 to skip the plots, SCALE_SKIP=store|sim,
#      SCALE_BASELINE=<an older rdrun-store-bench binary>: its server too (server=rdrun-before),
#      each size right after the current one, with the current generator.
set -euo pipefail
cd "$(dirname "$0")/.."

STORE_SIZES="${SCALE_STORE_SIZES:-1000,2000,4000,8000,16000,19000}"
TORCH_SIZES="${SCALE_TORCH_SIZES:-1000,2000}"
SIM_SIZES="${SCALE_SIM_SIZES:-128,1000}"
CAP="${SCALE_CAP_S:-120}"
OUT="${SCALE_OUT:-target/bench-scale}"
SKIP="${SCALE_SKIP:-}"

echo "== building rdrun-store-bench and rdrun-rdzv-sim (release)" >&2
cargo build --release --quiet --no-default-features --bin rdrun-store-bench --bin rdrun-rdzv-sim
BENCH=target/release/rdrun-store-bench
SIM=target/release/rdrun-rdzv-sim
mkdir -p "$OUT"
RESULTS="$OUT/results.txt"
: >"$RESULTS"
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

wait_port() { # file -> prints the port
  for _ in $(seq 1 1200); do
    if grep -q '^port=' "$1" 2>/dev/null; then sed -n 's/^port=//p' "$1"; return 0; fi
    sleep 0.1
  done
  echo "bench-scale: error: server did not print its port ($1)" >&2; exit 1
}
start_server() { # kind name -> sets SRV_PID, SRV_PORT
  if [ "$1" = rdrun ]; then
    "$BENCH" serve --threads 0 >"$TMP/$2.out" 2>"$TMP/$2.err" &
  elif [ "$1" = rdrun-before ]; then
    "$SCALE_BASELINE" serve --threads 0 >"$TMP/$2.out" 2>"$TMP/$2.err" &
  else
    "$PY" scripts/store_bench.py serve >"$TMP/$2.out" 2>"$TMP/$2.err" &
  fi
  SRV_PID=$!; PIDS+=("$SRV_PID"); SRV_PORT="$(wait_port "$TMP/$2.out")"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

PY=""
if [ -z "${SCALE_NO_TORCH:-}" ]; then PY="$(scripts/torch-venv.sh | tail -n 1)"; fi
echo "machine: $(nproc) cores, $(uname -sr), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
  "somaxconn $(cat /proc/sys/net/core/somaxconn), fd limit $(ulimit -n)" | tee "$OUT/machine.txt"

if [ "$SKIP" != store ]; then
  echo; echo "(a) store, PyTorch's start-up pattern (cap ${CAP}s per run)"
  # rdrun (and the baseline build, if given) interleaved per size, so both meet the same load.
  RUNS=""
  for n in ${STORE_SIZES//,/ }; do
    RUNS="$RUNS rdrun:$n"
    [ -n "${SCALE_BASELINE:-}" ] && RUNS="$RUNS rdrun-before:$n"
  done
  if [ -n "$PY" ]; then for n in ${TORCH_SIZES//,/ }; do RUNS="$RUNS torch:$n"; done; fi
  for run in $RUNS; do
    kind="${run%%:*}"; n="${run#*:}"
    {
      start_server "$kind" "s_${kind}_$n"
      line=$(timeout $((CAP + 30)) "$BENCH" startup --port "$SRV_PORT" --clients "$n" \
        --server-pid "$SRV_PID" --timeout-secs "$CAP" --tag "s$n" 2>"$TMP/g.err") \
        || line="clients=$n wall_s=unfinished cap_s=$CAP $(tail -n 1 "$TMP/g.err" | tr ' ' '_')"
      stop "$SRV_PID"
      echo "kind=store server=$kind load=$(cut -d' ' -f1 /proc/loadavg) $line" | tee -a "$RESULTS"
      sleep 2 # let the loopback sockets of this run leave TIME_WAIT pressure behind
    }
  done
fi

if [ "$SKIP" != sim ]; then
  echo; echo "(b) c10d rendezvous, simulated nodes in one process (cap ${CAP}s per run)"
  for n in ${SIM_SIZES//,/ }; do
    start_server rdrun "r_$n"
    line=$(timeout $((CAP + 30)) "$SIM" --port "$SRV_PORT" --nodes "$n" --server-pid "$SRV_PID" \
      --steady-secs 10 --kill-one --timeout-secs "$CAP" 2>"$TMP/sim.err") \
      || line="nodes=$n join_s=unfinished cap_s=$CAP $(tail -n 1 "$TMP/sim.err" | tr ' ' '_')"
    stop "$SRV_PID"
    echo "kind=rdzv impl=rdrun-sim $line" | tee -a "$RESULTS"
  done
fi

if [ -z "${SCALE_NO_PLOT:-}" ] && [ -n "$PY" ]; then
  "$PY" -c 'import matplotlib' 2>/dev/null || "$PY" -m pip install --quiet matplotlib
  "$PY" scripts/plot-scale.py "$RESULTS" "$OUT"
fi
echo "results: $RESULTS"
