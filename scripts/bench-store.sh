#!/usr/bin/env bash
# Benchmarks rdrun's TCPStore-compatible server against PyTorch's own TCPStore server (libuv
# backend) in one run, on loopback, and prints ratios (rdrun / torch; for wall time torch / rdrun).
#   (a) PyTorch's Python client, 1 connection: SET, ADD, GET ops/s
#   (b) rdrun-store-bench load generator, 1 / 64 / 1024 raw connections, SET+GET+ADD mix, request-
#       response (depth 1) and pipelined (depth 16): req/s
#   (c) 4096 clients: connect, VALIDATE, PING, ADD, WAIT on a key the last one sets: wall time
#   (d) server RSS with 10,000 idle validated connections
# Every phase is bounded (BENCH_CAP_S caps the phases that can stall on PyTorch's server, whose
# accept path does a reverse-DNS lookup per connection). Results: docs/benchmarks.md.
# Env: BENCH_SECS (seconds per throughput phase, default 2), BENCH_CAP_S (default 20),
#      RDRUN_BENCH_THREADS (rdrun server tokio workers; 0 = current-thread runtime, default 0).
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${BENCH_SECS:-2}"
CAP="${BENCH_CAP_S:-20}"
THREADS="${RDRUN_BENCH_THREADS:-0}"

echo "== building rdrun-store-bench (release)" >&2
cargo build --release --quiet --no-default-features --bin rdrun-store-bench
BENCH=target/release/rdrun-store-bench
PY="$(scripts/torch-venv.sh | tail -n 1)"
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
  for _ in $(seq 1 600); do
    if grep -q '^port=' "$1" 2>/dev/null; then sed -n 's/^port=//p' "$1"; return 0; fi
    sleep 0.1
  done
  echo "bench-store: error: server did not print its port ($1)" >&2; cat "${1%.out}.err" >&2; exit 1
}
start_rdrun() { # name -> sets SRV_PID, SRV_PORT
  "$BENCH" serve --threads "$THREADS" >"$TMP/$1.out" 2>"$TMP/$1.err" &
  SRV_PID=$!; PIDS+=("$SRV_PID"); SRV_PORT="$(wait_port "$TMP/$1.out")"
}
start_torch() {
  "$PY" scripts/store_bench.py serve >"$TMP/$1.out" 2>"$TMP/$1.err" &
  SRV_PID=$!; PIDS+=("$SRV_PID"); SRV_PORT="$(wait_port "$TMP/$1.out")"
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
rss_kb() { awk '/^VmRSS/{print $2}' "/proc/$1/status"; }
field() { # line key -> value
  sed -n "s/.*\\b$2=\\([^ ]*\\).*/\\1/p" <<<"$1"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b+0 > 0 && a+0 > 0) printf "%.2f", a/b; else print "n/a" }'; }

echo "machine: $(nproc) cores, $(uname -sr); torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
echo "rdrun server runtime: $([ "$THREADS" = 0 ] && echo current-thread || echo "multi-thread x$THREADS")"

start_rdrun rd; RD_PID=$SRV_PID; RD_PORT=$SRV_PORT
start_torch pt; PT_PID=$SRV_PID; PT_PORT=$SRV_PORT

# Both servers must pass the same PyTorch-client sanity check before anything is measured.
for p in "$RD_PORT" "$PT_PORT"; do
  "$PY" scripts/store_bench.py compat "$p" 2>"$TMP/compat.err" | grep -q '^compat=ok' || {
    echo "bench-store: error: PyTorch client check failed against port $p:" >&2
    tail -n 5 "$TMP/compat.err" >&2; exit 1; }
done
echo "PyTorch client check: ok against both servers"

echo; echo "(a) PyTorch Python client, 1 connection, ${SECS}s per op, best of 2 interleaved rounds (ops/s)"
for round in 1 2; do
  "$PY" scripts/store_bench.py ops "$RD_PORT" "$SECS" 2>/dev/null >>"$TMP/a_rd"
  "$PY" scripts/store_bench.py ops "$PT_PORT" "$SECS" 2>/dev/null >>"$TMP/a_pt"
done
best() { # file op -> max ops_per_s
  grep "op=$2 " "$1" | sed -n 's/.*ops_per_s=\([0-9]*\).*/\1/p' | sort -n | tail -n 1
}
printf "%-6s %12s %12s %8s\n" op rdrun torch ratio
for op in set add get; do
  r=$(best "$TMP/a_rd" "$op"); t=$(best "$TMP/a_pt" "$op")
  printf "%-6s %12s %12s %8s\n" "$op" "$r" "$t" "$(ratio "$r" "$t")"
done

echo; echo "(b) rdrun-store-bench SET/GET/ADD mix over raw connections (answers checked), ${SECS}s per phase,"
echo "    servers interleaved, best of 2 (req/s); depth 1 = each request waits for its answer (PyTorch's"
echo "    client pattern), depth 16 = 16 SET+GET+ADD triples per write (pipelined, as redis-benchmark -P)"
timeout 600 "$BENCH" load --ports "$RD_PORT,$PT_PORT" --conns 1,64,1024 --depth 1,16 --secs "$SECS" \
  --rounds 2 --tag b >"$TMP/b" 2>"$TMP/b.err" || echo "(load phase failed or ended early: $(tail -n 1 "$TMP/b.err"))"
sed -n "s/^load: port $RD_PORT: /  rdrun: /p; s/^load: port $PT_PORT: /  torch: /p" "$TMP/b.err"
bestb() { # port conns depth -> max req_per_s
  grep "^port=$1 conns=$2 depth=$3 " "$TMP/b" | sed -n 's/.*req_per_s=\([0-9]*\).*/\1/p' | sort -n | tail -n 1
}
printf "%-6s %6s %12s %12s %8s\n" conns depth rdrun torch ratio
for d in 1 16; do
  for n in 1 64 1024; do
    r=$(bestb "$RD_PORT" "$n" "$d"); t=$(bestb "$PT_PORT" "$n" "$d")
    printf "%-6s %6s %12s %12s %8s\n" "$n" "$d" "${r:-n/a}" "${t:-n/a}" "$(ratio "${r:-0}" "${t:-0}")"
  done
done
stop "$RD_PID"; stop "$PT_PID"

echo; echo "(c) 4096 clients: connect+VALIDATE+PING, ADD, WAIT on the last one's key (wall s; cap ${CAP}s)"
start_rdrun rd_c; RD_PID=$SRV_PID
RC=$("$BENCH" herd --port "$SRV_PORT" --clients 4096 --timeout-secs "$CAP" --tag c 2>/dev/null)
stop "$RD_PID"
start_torch pt_c; PT_PID=$SRV_PID
TC=$("$BENCH" herd --port "$SRV_PORT" --clients 4096 --timeout-secs "$CAP" --tag c 2>/dev/null)
stop "$PT_PID"
echo "  rdrun: $RC"; echo "  torch: $TC"
r=$(field "$RC" wall_s); t=$(field "$TC" wall_s)
if [ "$t" = unfinished ]; then
  echo "  speedup: > $(ratio "$CAP" "$r")x (torch finished $(field "$TC" finished) of 4096 within ${CAP}s)"
else
  echo "  speedup (torch/rdrun): $(ratio "$t" "$r")x"
fi

echo; echo "(d) server RSS with 10,000 idle validated connections (connect cap ${CAP}s)"
idle_rss() { # kind -> "base_kb loaded_kb ready_line"
  if [ "$1" = rdrun ]; then start_rdrun "d_$1"; else start_torch "d_$1"; fi
  local pid=$SRV_PID base; base=$(rss_kb "$pid")
  "$BENCH" idle --port "$SRV_PORT" --conns 10000 --connect-secs "$CAP" --hold-secs 60 >"$TMP/d_$1.idle" 2>&1 &
  local ipid=$!; PIDS+=("$ipid")
  for _ in $(seq 1 $(( (CAP + 30) * 10 ))); do grep -qs '^ready=' "$TMP/d_$1.idle" && break; sleep 0.1; done
  sleep 1
  echo "$base $(rss_kb "$pid") $(grep '^ready=' "$TMP/d_$1.idle" || echo ready=0)"
  stop "$ipid"; stop "$pid"
}
read -r RB RL RR <<<"$(idle_rss rdrun)"
read -r TB TL TR <<<"$(idle_rss torch)"
rn=$(field "$RR" ready); tn=$(field "$TR" ready)
printf "%-6s %10s %10s %10s %12s %14s\n" server conns base_MiB rss_MiB delta_MiB per_conn_KiB
for row in "rdrun $rn $RB $RL" "torch $tn $TB $TL"; do
  read -r name n b l <<<"$row"
  awk -v name="$name" -v n="$n" -v b="$b" -v l="$l" 'BEGIN{ printf "%-6s %10d %10.1f %10.1f %12.1f %14.2f\n", name, n, b/1024, l/1024, (l-b)/1024, (n>0)?(l-b)/n:0 }'
done
