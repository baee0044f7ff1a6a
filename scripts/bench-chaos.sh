#!/usr/bin/env bash
# Recovery under chaos (issue 41): KILLS injected kills of a random rank of a NPROC-rank gloo DDP
# job, one every GAP seconds after the previous recovery, and how long each took to recover:
#   default   rdrun --chaos kill:after=GAP,every=GAP,count=KILLS,seed=SEED (no other flag: the
#             default warm start)
#   cold      the same with --warm-start off
#   torchrun  torchrun --max-restarts KILLS, and this script as the external killer: the same
#             gaps counted the same way (from the recovery), a rank drawn at random (seeded),
#             SIGKILL of that rank's process
# The job (every launcher the same script): each rank writes, per attempt, the time its script
# started (time.time_ns(), its first line) and its pid, and the time its first training step
# was done; it prints "ready" once its process group is up (its first output: rdrun's "back in
# user code", from which the next gap counts), then "step N" every 0.05 s; rank 0 checkpoints
# every 10 steps and a restarted attempt resumes from the checkpoint. Measured per kill, from the
# job's own marks so that the three are measured alike: kill -> the LAST rank of the next
# attempt started ("script start"), and -> the last rank's first step done ("first step", the
# job training again). For rdrun, its own table (--report-json's chaos.summary: kill -> every
# rank's first output) is printed beside them.
# Usage: scripts/bench-chaos.sh   (env: KILLS=20, NPROC=4, GAP=3, SEED=1, STEPS=100000,
#        KINDS="default cold torchrun", TORCHRUN=path, RDRUN=path, PYTHON=path; rdrun is built in
#        release mode unless RDRUN is given)
set -euo pipefail
cd "$(dirname "$0")/.."

KILLS="${KILLS:-20}"
NPROC="${NPROC:-4}"
GAP="${GAP:-3}"
SEED="${SEED:-1}"
KINDS="${KINDS:-default cold torchrun}"
unset RDRUN_WARM_START RDRUN_PRELOAD RDRUN_CHAOS
# shellcheck source=scripts/bench-torch-lib.sh
. scripts/bench-torch-lib.sh bench-chaos
# The launcher running in the background, ended with the script whatever happens.
LAUNCHER=
trap '{ [ -z "$LAUNCHER" ] || kill -TERM "$LAUNCHER" 2>/dev/null; rm -rf "$TMP"; } || true' EXIT

cat >"$TMP/job.py" <<'EOF'
import os, sys, time
t_start = time.time_ns()
marks = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
tag = f"{attempt}.{rank}"
with open(os.path.join(marks, f"up.{tag}"), "w") as f:
    f.write(f"{t_start} {os.getpid()}\n")
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="env://")
torch.manual_seed(0)
model = DDP(nn.Linear(64, 64))
# The job's first output: rdrun's "back in user code" mark, from which --chaos's next gap counts
# (printed once the process group is up, so that no kill lands before a step was trained).
print("ready", flush=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = os.path.join(marks, "ckpt.pt")
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, map_location="cpu")
    model.module.load_state_dict(state["model"])
    start = state["step"] + 1
steps = int(sys.argv[2])
for step in range(start, steps):
    opt.zero_grad()
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step()
    if step == start:
        with open(os.path.join(marks, f"step.{tag}"), "w") as f:
            f.write(f"{time.time_ns()}\n")
    print(f"step {step}", flush=True)
    if rank == 0 and step % 10 == 9:
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    # Every rank leaves at the same step (a rank alone in a collective would wait for ever).
    stop = torch.tensor([float(os.path.exists(os.path.join(marks, "stop")))])
    dist.all_reduce(stop)
    if stop.item() > 0:
        break
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
EOF

# The time (ns) every rank of attempt $1 has its mark $2 (up, step), or nothing yet.
all_marked() {
  local a="$1" kind="$2" r latest=0 t
  for ((r = 0; r < NPROC; r++)); do
    [ -s "$MARKS/$kind.$a.$r" ] || return 0
    t=$(cut -d' ' -f1 "$MARKS/$kind.$a.$r")
    ((t > latest)) && latest=$t
  done
  echo "$latest"
}

# The first attempt after attempt $1 in which every rank trained a step (a restart that failed
# on its own, as torchrun's may, is passed over), or nothing yet.
next_trained() {
  local b
  for ((b = $1 + 1; b <= $1 + 2 * KILLS + 2; b++)); do
    if [ -n "$(all_marked "$b" step)" ]; then
      echo "$b"
      return
    fi
  done
}

# Prints "script-start first-step" seconds per kill, from the kills in file $1 ("NS ATTEMPT" a
# line: the kill's time and the attempt it hit): kill -> the last rank's start and first step
# in the first attempt after it that trained; a kill never recovered from is left out.
per_kill() {
  local kill a b
  while read -r kill a; do
    b=$(next_trained "$a")
    [ -n "$b" ] || continue
    awk -v k="$kill" -v u="$(all_marked "$b" up)" -v s="$(all_marked "$b" step)" \
      'BEGIN {printf "%.3f %.3f\n", (u-k)/1e9, (s-k)/1e9}'
  done <"$1"
}

# torchrun and the external killer: the same schedule as --chaos, counted the same way (from
# the recovery: every rank of the attempt trained). An attempt that fails on its own (torchrun
# 2.15's restart may die in gloo's connectFullMesh, see bench-recovery.sh) is restarted by
# torchrun and passed over; no trained attempt within 120 s ends the schedule.
run_torchrun() {
  PYTHON_EXEC="$PYTHON" "$TORCHRUN" --standalone --nproc-per-node "$NPROC" \
    --max-restarts "$((3 * KILLS))" "$TMP/job.py" "$MARKS" "${STEPS:-100000}" \
    >"$TMP/out.log" 2>&1 &
  local launcher=$! k cur=-1 up rank pid now deadline
  LAUNCHER=$launcher
  RANDOM=$SEED
  : >"$TMP/kills"
  for ((k = 0; k < KILLS; k++)); do
    deadline=$((SECONDS + 120))
    while [ -z "$(next_trained "$cur")" ]; do
      if ! kill -0 "$launcher" 2>/dev/null || ((SECONDS > deadline)); then
        echo "  torchrun: no attempt trained again after $k kill(s) (ended or 120 s):" >&2
        grep -v "step [0-9]" "$TMP/out.log" | grep -i "error" | tail -n 3 | sed 's/^/    /' >&2
        kill -TERM "$launcher" 2>/dev/null || true
        wait "$launcher" || true
        return
      fi
      sleep 0.02
    done
    cur=$(next_trained "$cur")
    up=$(all_marked "$cur" step)
    now=$(date +%s%N)
    sleep "$(awk -v u="$up" -v n="$now" -v g="$GAP" 'BEGIN {d = (u - n) / 1e9 + g; print (d > 0 ? d : 0)}')"
    rank=$((RANDOM % NPROC))
    pid=$(cut -d' ' -f2 "$MARKS/up.$cur.$rank")
    echo "$(date +%s%N) $cur" >>"$TMP/kills"
    kill -KILL "$pid"
  done
  deadline=$((SECONDS + 120))
  while [ -z "$(next_trained "$cur")" ] && ((SECONDS < deadline)) && kill -0 "$launcher" 2>/dev/null; do
    sleep 0.05
  done
  touch "$MARKS/stop"
  wait "$launcher" || true
}

run_rdrun() {
  local warm="$1" memory="$2"
  rm -rf "$TMP/memory" && mkdir -p "$TMP/memory"
  # shellcheck disable=SC2086 # $warm: no flag, or two words
  PYTHON_EXEC="$PYTHON" RDRUN_WARM_MEMORY="$memory" "$RDRUN" --standalone \
    --nproc-per-node "$NPROC" --max-restarts "$KILLS" $warm \
    --chaos "kill:after=${GAP}s,every=${GAP}s,count=$KILLS,seed=$SEED" \
    --report-json "$TMP/report.json" "$TMP/job.py" "$MARKS" "${STEPS:-100000}" \
    >"$TMP/out.log" 2>&1 &
  local launcher=$!
  LAUNCHER=$launcher
  # Until the attempt after the last kill trains (rdrun restarts every kill: attempt KILLS).
  local deadline=$((SECONDS + 60 * KILLS + 120))
  while [ -z "$(all_marked "$KILLS" step)" ] && ((SECONDS < deadline)) && kill -0 "$launcher" 2>/dev/null; do
    sleep 0.05
  done
  touch "$MARKS/stop"
  wait "$launcher" || true
  "$PYTHON" - "$TMP/report.json" >"$TMP/kills" <<'EOF'
import json, sys
for f in json.load(open(sys.argv[1]))["chaos"]["faults"]:
    print(int(f["injected_at"] * 1e9), f["attempt"])
EOF
  "$PYTHON" - "$TMP/report.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["chaos"]["summary"]["kill"]
r = s["recover_s"]
print(f"  rdrun's own table: {s['injected']} injected, {s['survived']} survived, "
      f"recover median {r['median']:.2f} s, p95 {r['p95']:.2f} s, max {r['max']:.2f} s")
EOF
}

printf '%-10s %6s  %-28s %-28s\n' launcher kills "script start median/p95 (s)" "first step median/p95 (s)"
for kind in $KINDS; do
  rm -rf "$MARKS" && mkdir -p "$MARKS"
  case "$kind" in
    default) run_rdrun "" "$TMP/memory" ;;
    cold) run_rdrun "--warm-start off" off ;;
    torchrun) run_torchrun ;;
    *) echo "bench-chaos: unknown kind $kind" >&2; exit 2 ;;
  esac
  per_kill "$TMP/kills" >"$TMP/per_kill"
  n=$(wc -l <"$TMP/per_kill")
  p95() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else {i = int(0.95 * NR + 0.999); print a[i < 1 ? 1 : i]}}'; }
  rec="$(cut -d' ' -f1 "$TMP/per_kill" | median)/$(cut -d' ' -f1 "$TMP/per_kill" | p95)"
  stp="$(cut -d' ' -f2 "$TMP/per_kill" | median)/$(cut -d' ' -f2 "$TMP/per_kill" | p95)"
  printf '%-10s %6s  %-28s %-28s\n' "$kind" "$n" "$rec" "$stp"
done
