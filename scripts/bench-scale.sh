#!/usr/bin/env bash
# Scale benchmarks (issue 16), results in docs/benchmarks.md ("Scale"):
#   (a) the store under PyTorch's start-up pattern (rdrun-store-bench startup: connect +
#       VALIDATE, the init/ ADD, own-key SET, rank 0's shared SET that all GET, ADD + WAIT
#       barrier) at each size in SCALE_STORE_SIZES against a fresh rdrun server, and at each size
#       in SCALE_TORCH_SIZES against a fresh PyTorch libuv TCPStore server, in the same run;
#       capped at SCALE_CAP_S per run;
#   (b) the c10d rendezvous of SCALE_SIM_SIZES simulated nodes in one process (rdrun-rdzv-sim),
#       against a fresh rdrun store process the simulator starts: join time, store CPU and bytes
#       moved during the join and at steady state, detection of one lost node;
#   (c) real agents: SCALE_REAL_SIZES rdrun agents (c10d, one `true` worker each, all on this
#       machine) through one round to the end of the job, and SCALE_TORCHRUN_SIZES torchrun
#       agents the same way; wall time until every agent exited.
# Every result line carries the load average at its start (load=1m/5m/15m): the machine may be
# shared, and wall times on a loaded machine are mostly waiting for a CPU.
# Raw result lines go to $SCALE_OUT/results.txt (one key=value line per run); then
# scripts/plot-scale.py draws one log-log PNG per measure into $SCALE_OUT (matplotlib is
# installed into the PyTorch venv on demand).
# Env: SCALE_STORE_SIZES (default 1000,2000,4000,8000,16000,19000), SCALE_TORCH_SIZES (default
#      1000,2000), SCALE_SIM_SIZES (default 128,1000,4000,10000), SCALE_REAL_SIZES (default
#      8,32,128,256), SCALE_TORCHRUN_SIZES (default 8,16,32), SCALE_CAP_S (default 120),
#      SCALE_OUT (default target/bench-scale), SCALE_NO_PLOT=1 to skip the plots,
#      SCALE_SKIP=store|sim|real (comma-separated),
#      SCALE_BASELINE=<an older rdrun-store-bench binary>: its server too (server=rdrun-before),
#      each size right after the current one, with the current generator,
#      SCALE_GEN_NICE (default 19; 0 to skip): each rdrun size once more with the generators
#      at that nice value (server=rdrun-nice; the coordinator and its fresh-client probe stay
#      at normal priority), so that on this one machine the clients' CPU yields to the
#      server's as it would were they on other hosts,
#      SCALE_TORCH_NODNS (default 1; 0 to skip): PyTorch's libuv server at every store size
#      too with its reverse-DNS lookup per accept failing at once (server=torch-nodns, and
#      torch-nodns-nice with the niced generators): it runs in a private mount namespace whose
#      /etc/resolv.conf names a resolver on 127.0.0.1 (needs root and unshare; skipped, and
#      said, otherwise). PyTorch logs "The hostname of the client socket cannot be retrieved"
#      once per accept there and serves on; with the machine's resolver each accept waits for
#      a PTR query (server=torch).
set -euo pipefail
cd "$(dirname "$0")/.."

STORE_SIZES="${SCALE_STORE_SIZES:-1000,2000,4000,8000,16000,19000}"
TORCH_SIZES="${SCALE_TORCH_SIZES:-1000,2000}"
SIM_SIZES="${SCALE_SIM_SIZES:-128,1000,4000,10000}"
REAL_SIZES="${SCALE_REAL_SIZES:-8,32,128,256}"
TORCHRUN_SIZES="${SCALE_TORCHRUN_SIZES:-8,16,32}"
CAP="${SCALE_CAP_S:-120}"
OUT="${SCALE_OUT:-target/bench-scale}"
SKIP="${SCALE_SKIP:-}"
GEN_NICE="${SCALE_GEN_NICE:-19}"
TORCH_NODNS="${SCALE_TORCH_NODNS:-1}"

echo "== building rdrun-store-bench and rdrun-rdzv-sim (release)" >&2
cargo build --release --quiet --no-default-features --bin rdrun-store-bench --bin rdrun-rdzv-sim \
  --bin rdrun
BENCH=target/release/rdrun-store-bench
SIM=target/release/rdrun-rdzv-sim
RDRUN=target/release/rdrun
skipped() { case ",$SKIP," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
load() { cut -d' ' -f1-3 /proc/loadavg | tr ' ' '/'; }
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
  if [ "$1" = rdrun ] || [ "$1" = rdrun-nice ]; then
    "$BENCH" serve --threads 0 >"$TMP/$2.out" 2>"$TMP/$2.err" &
  elif [ "$1" = rdrun-before ]; then
    "$SCALE_BASELINE" serve --threads 0 >"$TMP/$2.out" 2>"$TMP/$2.err" &
  elif [ "$1" = torch-nodns ] || [ "$1" = torch-nodns-nice ]; then
    # unshare and sh exec: the server's pid is $!.
    printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$TMP/resolv.conf"
    unshare -m --propagation private sh -c 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"' \
      sh "$TMP/resolv.conf" "$PY" scripts/store_bench.py serve >"$TMP/$2.out" 2>"$TMP/$2.err" &
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

if ! skipped store; then
  echo; echo "(a) store, PyTorch's start-up pattern (cap ${CAP}s per run)"
  # rdrun (and the baseline build, if given) interleaved per size, so both meet the same load.
  RUNS=""
  for n in ${STORE_SIZES//,/ }; do
    RUNS="$RUNS rdrun:$n"
    [ "$GEN_NICE" != 0 ] && RUNS="$RUNS rdrun-nice:$n"
    [ -n "${SCALE_BASELINE:-}" ] && RUNS="$RUNS rdrun-before:$n"
  done
  if [ -n "$PY" ]; then for n in ${TORCH_SIZES//,/ }; do RUNS="$RUNS torch:$n"; done; fi
  if [ -n "$PY" ] && [ "$TORCH_NODNS" != 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null \
      && unshare -m --propagation private true 2>/dev/null; then
      # After rdrun's runs of each size, in the same run (interleaved, so both meet one load).
      R2=""
      for run in $RUNS; do
        R2="$R2 $run"
        case "$run" in
          rdrun:*) R2="$R2 torch-nodns:${run#*:}"
            [ "$GEN_NICE" != 0 ] && R2="$R2 torch-nodns-nice:${run#*:}" ;;
        esac
      done
      RUNS="$R2"
    else
      echo "(PyTorch without its DNS lookup skipped: needs root and unshare -m)"
    fi
  fi
  for run in $RUNS; do
    kind="${run%%:*}"; n="${run#*:}"
    {
      start_server "$kind" "s_${kind}_$n"
      nice_args=()
      case "$kind" in *-nice) nice_args=(--gen-nice "$GEN_NICE") ;; esac
      line=$(timeout $((CAP + 30)) "$BENCH" startup --port "$SRV_PORT" --clients "$n" "${nice_args[@]}" \
        --server-pid "$SRV_PID" --timeout-secs "$CAP" --tag "s$n" 2>"$TMP/g.err") \
        || line="clients=$n wall_s=unfinished cap_s=$CAP $(tail -n 1 "$TMP/g.err" | tr ' ' '_')"
      stop "$SRV_PID"
      echo "kind=store server=$kind load=$(cut -d' ' -f1 /proc/loadavg) $line" | tee -a "$RESULTS"
      sleep 2 # let the loopback sockets of this run leave TIME_WAIT pressure behind
    }
  done
fi

if ! skipped sim; then
  echo; echo "(b) c10d rendezvous, simulated nodes in one process (cap ${CAP}s per run)"
  for n in ${SIM_SIZES//,/ }; do
    l="$(load)"
    line=$(timeout $((CAP + 30)) "$SIM" --nodes "$n" --steady-secs 10 --kill-one \
      --timeout-secs "$CAP" 2>"$TMP/sim.err") \
      || line="nodes=$n join_s=unfinished cap_s=$CAP $(tail -n 1 "$TMP/sim.err" | tr ' ' '_')"
    echo "kind=rdzv impl=rdrun-sim $line load=$l" | tee -a "$RESULTS"
    sleep 2
  done
fi

agents() { # impl n -> one result line: n agents of impl (c10d, one `true` worker) to the end
  local impl=$1 n=$2 port l t0 pids=() ok=0 p
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  l="$(load)"
  mkdir -p "$TMP/a_${impl}_$n"
  t0=$(date +%s.%N)
  for i in $(seq 1 "$n"); do
    if [ "$impl" = rdrun ]; then
      "$RDRUN" --nnodes "$n" --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "scale$n" --no-python true \
        >"$TMP/a_${impl}_$n/$i.log" 2>&1 &
    else
      "$PY" -m torch.distributed.run --nnodes "$n" --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "scale$n" --no-python true \
        >"$TMP/a_${impl}_$n/$i.log" 2>&1 &
    fi
    pids+=("$!")
  done
  local end=$(( $(date +%s) + CAP ))
  while [ "$(date +%s)" -lt "$end" ]; do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
  done
  local wall; wall=$(echo "$(date +%s.%N) - $t0" | bc)
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
    elif wait "$p"; then ok=$((ok + 1)); fi
  done
  if [ "$ok" -eq "$n" ]; then
    echo "kind=agents impl=$impl nodes=$n wall_s=$wall ok=$ok load=$l"
  else
    echo "kind=agents impl=$impl nodes=$n wall_s=unfinished ok=$ok cap_s=$CAP load=$l"
  fi
}

if ! skipped real; then
  echo; echo "(c) real agents on this machine, c10d, one true worker each (cap ${CAP}s per run)"
  for n in ${REAL_SIZES//,/ }; do agents rdrun "$n" | tee -a "$RESULTS"; sleep 2; done
  if [ -n "$PY" ]; then
    for n in ${TORCHRUN_SIZES//,/ }; do agents torchrun "$n" | tee -a "$RESULTS"; sleep 2; done
  fi
fi

if [ -z "${SCALE_NO_PLOT:-}" ] && [ -n "$PY" ]; then
  "$PY" -c 'import matplotlib' 2>/dev/null || "$PY" -m pip install --quiet matplotlib
  "$PY" scripts/plot-scale.py "$RESULTS" "$OUT"
fi
echo "results: $RESULTS"
