#!/usr/bin/env bash
# Hang-detection benchmark (issue 13), numbers for docs/benchmarks.md:
#   (a) detection latency against the budget: 2 silent `sleep` workers, --hang-timeout B for
#       several B (poll 0.5 s); latency = time of the capture files minus the workers' start
#       stamp, minus the capture time rdrun prints;
#   (b) capture time per rank: N python workers sleeping in a function, py-spy found beside
#       their python; the "captured diagnostics in X s" of the block, for N = 2 and 8;
#   (c) the monitor's own CPU: rdrun's utime+stime over 60 s (default settings: 5 s poll)
#       with 4 and 32 idle workers, in % of one core;
#   (d) the same hung job (rank 1 stops; torch imported by the FileTimer variant only) under
#       rdrun (default detection, budget B), torchrun (no detection) and torchrun with torch's
#       FileTimer (`expires(after=B)`): time from the hang to a restarted, progressing job.
# Usage: scripts/bench-hang.sh  (env: RDRUN=path, else a release build; TORCH_VENV=dir;
#        BUDGETS="2 5 10"; CPU_SECS=60; WAIT_TORCHRUN=60 (how long torchrun gets to restart);
#        PARTS="a b c d" to run only some parts)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="$(scripts/torch-venv.sh | tail -n 1)"
VENV_BIN="$(dirname "$PY")"
TORCHRUN="$VENV_BIN/torchrun"
BUDGETS="${BUDGETS:-2 5 10}"
CPU_SECS="${CPU_SECS:-60}"
WAIT_TORCHRUN="${WAIT_TORCHRUN:-60}"
if [ -z "${RDRUN:-}" ]; then
  cargo build --release --no-default-features --bin rdrun >&2
  RDRUN="$ROOT/target/release/rdrun"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export PATH="$VENV_BIN:$PATH" OMP_NUM_THREADS=1
unset RDRUN_HANG_DETECT RDRUN_HANG_TIMEOUT RDRUN_HANG_STARTUP_TIMEOUT RDRUN_HANG_POLL_INTERVAL

now() { "$PY" -c 'import time; print(time.time())'; }
PARTS="${PARTS:-a b c d}"
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if part a; then
echo "== (a) detection latency vs budget (2 silent workers, poll 0.5 s)"
printf '%-8s %-10s %-10s\n' budget latency over
for b in $BUDGETS; do
  d="$TMP/a$b"; mkdir -p "$d"
  t0=$(now)
  timeout 120 "$RDRUN" --standalone --nproc-per-node 2 --hang-timeout "$b" \
    --hang-startup-timeout "$b" --hang-poll-interval 0.5 --log-dir "$d/logs" \
    --no-python sh -c 'exec sleep 300' </dev/null >"$d/out" 2>"$d/err" || true
  f=$(find "$d/logs" -name rank0.txt | head -1)
  cap=$(grep -o 'captured diagnostics in [0-9.]*s' "$d/err" | grep -o '[0-9.]*' | head -1)
  "$PY" - "$t0" "$f" "$cap" "$b" <<'PYEOF'
import os, sys
t0, f, cap, b = float(sys.argv[1]), sys.argv[2], float(sys.argv[3] or 0), float(sys.argv[4])
lat = os.stat(f).st_mtime - cap - t0
print(f"{b:<8g} {lat:<10.2f} {lat - b:<10.2f}")
PYEOF
done

fi
if part b; then
echo "== (b) capture time (py-spy --nonblocking, python workers sleeping in a function)"
for n in 2 8; do
  d="$TMP/b$n"; mkdir -p "$d"
  timeout 120 "$RDRUN" --standalone --nproc-per-node "$n" --hang-timeout 3 \
    --hang-startup-timeout 3 --hang-poll-interval 0.5 --log-dir "$d/logs" \
    --no-python "$PY" -c 'import time
def wait_here():
    time.sleep(300)
wait_here()' </dev/null >"$d/out" 2>"$d/err" || true
  cap=$(grep -o 'captured diagnostics in [0-9.]*s' "$d/err" | grep -o '[0-9.]*' | head -1)
  ok=$(grep -l "python stack: ok" $(find "$d/logs" -name 'rank*.txt') | wc -l)
  echo "ranks $n: capture ${cap}s in total (all ranks in parallel), stacks ok: $ok/$n"
done

fi
if part c; then
echo "== (c) monitor CPU: rdrun's own utime+stime over ${CPU_SECS}s, idle workers, defaults"
for n in 4 32; do
  d="$TMP/c$n"; mkdir -p "$d"
  "$RDRUN" --standalone --nproc-per-node "$n" --no-python sleep $((CPU_SECS + 30)) \
    </dev/null >"$d/out" 2>"$d/err" &
  pid=$!
  sleep 5
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  a=$(ticks); sleep "$CPU_SECS"; b=$(ticks)
  kill -TERM "$pid"; wait "$pid" || true
  hz=$(getconf CLK_TCK)
  "$PY" -c "print(f'workers $n: {100 * ($b - $a) / $hz / $CPU_SECS:.3f} % of one core ({$b - $a} ticks)')"
done

fi
if part d; then
echo "== (d) the same hung job: time from the hang to a restarted, progressing job (budget B=5 s)"
job() { # launcher-name extra-env...
  local name="$1"; shift
  local d="$TMP/d-$name"; mkdir -p "$d/tmp"
  local cmd
  case "$name" in
    rdrun) cmd=("$RDRUN" --standalone --nproc-per-node 2 --max-restarts 1 --hang-timeout 5
                --hang-startup-timeout 30 --hang-poll-interval 0.5) ;;
    # The timer fires first (the detection budget stays at its default): capture, then signal.
    rdrun+FileTimer) cmd=("$RDRUN" --standalone --nproc-per-node 2 --max-restarts 1) ;;
    *) cmd=("$TORCHRUN" --standalone --nproc-per-node 2 --max-restarts 1) ;;
  esac
  local start rc=0
  start=$(now)
  env TMPDIR="$d/tmp" "$@" timeout "$WAIT_TORCHRUN" "${cmd[@]}" \
    "$ROOT/launcher-tests/torch/scripts/hang_bench.py" --out "$d" </dev/null >"$d/out" 2>"$d/err" || rc=$?
  "$PY" - "$d" "$name" "$rc" "$WAIT_TORCHRUN" <<'PYEOF'
import os, sys
d, name, rc, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
hung = float(open(os.path.join(d, "hung")).read()) if os.path.exists(os.path.join(d, "hung")) else None
prog = [float(open(os.path.join(d, f)).read()) for f in os.listdir(d) if f.startswith("progress.")]
if hung and prog:
    print(f"{name:<22} restarted and progressing {max(prog) - hung:.1f}s after the hang (exit {rc})")
else:
    what = "stopped by the bench's timeout" if rc in (124, 137) and name != "torchrun+FileTimer" else f"exit {rc}"
    print(f"{name:<22} no restarted attempt within {cap}s ({what})")
PYEOF
  # torchrun + FileTimer orphans the other workers: end them by the pids they recorded.
  for f in "$d"/pid.*; do
    [ -e "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true
  done
}
job rdrun
job torchrun
job "torchrun+FileTimer" TORCHELASTIC_ENABLE_FILE_TIMER=1 BENCH_TIMER=5
job "rdrun+FileTimer" TORCHELASTIC_ENABLE_FILE_TIMER=1 BENCH_TIMER=5
fi
