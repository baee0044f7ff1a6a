#!/usr/bin/env bash
# Teardown-abort benchmark (issue 38 item 0): how often a gloo DDP worker dies of SIGABRT
# ("terminate called without an active exception") at interpreter exit, rdrun and torchrun side
# by side, interleaved run by run so that both see the same machine load.
#   The job: two static nodes x 2 workers on loopback (--nnodes 2, node ranks 0 and 1, one
#   launcher each), every rank trains a small DDP model for 5 steps.
#   SCRIPTS picks the endings:
#     suite    the PyTorch suite's multinode script before issue 38 (torch.save, a file written,
#              destroy_process_group(), then a normal interpreter exit);
#     bare     destroy_process_group() right after the last step: the widest window for the race;
#     exit     the suite's ending now: as `suite`, then files flushed and os._exit(0) (no
#              interpreter finalisation).
#   Why it happens (docs/compat.md, "torch's teardown abort"): autograd stashes a Python object in
#   thread-local state during backward; every gloo work queued from DDP's hooks copies it, and the
#   gloo worker thread that finishes the last work must take the GIL to drop it. When the main
#   thread reaches interpreter finalisation first, CPython < 3.14 ends that thread with
#   pthread_exit, whose forced unwind crosses a noexcept destructor: std::terminate.
#   A launcher can only change how often the scheduler lets that thread run late.
# Usage: scripts/bench-teardown.sh   (env: RUNS=50, SCRIPTS="suite bare exit", LIMIT=60 (s), TORCHRUN=path,
#        RDRUN=path, PYTHON=path; rdrun is built in release mode unless RDRUN is given)
# Prints, per script and launcher: runs, runs with an abort, and the abort rate.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-50}"
SCRIPTS="${SCRIPTS:-suite bare exit}"
# A launcher that meets the abort may wait for the dead rank until it is killed (torchrun does):
# each launch is bounded.
LIMIT="${LIMIT:-60}"
# shellcheck source=scripts/bench-torch-lib.sh
. scripts/bench-torch-lib.sh bench-teardown

head_py='import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(100 + rank)
for _ in range(5):
    loss = model(torch.randn(16, 8, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'
save_py='out = sys.argv[1]
torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
           os.path.join(out, f"w.{rank}.pt"))
with open(os.path.join(out, f"group.{rank}"), "w") as f:
    f.write(os.environ["GROUP_RANK"])
dist.destroy_process_group()
'
printf '%s%s' "$head_py" "$save_py" >"$TMP/suite.py"
printf '%s%s' "$head_py" 'dist.destroy_process_group()
' >"$TMP/bare.py"
printf '%s%s%s' "$head_py" "$save_py" 'sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
' >"$TMP/exit.py"

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# one LAUNCHER SCRIPT: 0 when both nodes exited 0 without the abort, 1 on an abort, 2 otherwise.
one() {
  local launcher="$1" script="$2" port pa pb ra=0 rb=0 out="$TMP/out"
  port="$(free_port)"
  rm -rf "$out" && mkdir -p "$out"
  local common=(--nnodes 2 --master-addr 127.0.0.1 --master-port "$port" --nproc-per-node 2)
  local cmd
  if [ "$launcher" = rdrun ]; then cmd=("$RDRUN" "${common[@]}"); else cmd=("$TORCHRUN" "${common[@]}"); fi
  local prog=("$TMP/$script.py" "$out")
  [ "$launcher" = rdrun ] && prog=("$PYTHON" "${prog[@]}")
  OMP_NUM_THREADS=1 timeout -k 10 "$LIMIT" "${cmd[@]}" --node-rank 0 "${prog[@]}" >"$TMP/log0" 2>&1 &
  pa=$!
  OMP_NUM_THREADS=1 timeout -k 10 "$LIMIT" "${cmd[@]}" --node-rank 1 "${prog[@]}" >"$TMP/log1" 2>&1 &
  pb=$!
  wait "$pa" || ra=$?
  wait "$pb" || rb=$?
  if grep -q "terminate called without an active exception" "$TMP/log0" "$TMP/log1"; then
    return 1
  fi
  if [ "$ra" != 0 ] || [ "$rb" != 0 ]; then
    echo "bench-teardown: $launcher $script: exit $ra/$rb without the abort:" >&2
    tail -n 5 "$TMP/log0" "$TMP/log1" >&2
    return 2
  fi
  return 0
}

declare -A aborts other
for script in $SCRIPTS; do
  for launcher in rdrun torchrun; do
    aborts[$script.$launcher]=0
    other[$script.$launcher]=0
  done
done
for i in $(seq 1 "$RUNS"); do
  for script in $SCRIPTS; do
    for launcher in rdrun torchrun; do
      rc=0
      one "$launcher" "$script" || rc=$?
      [ "$rc" = 1 ] && aborts[$script.$launcher]=$((aborts[$script.$launcher] + 1))
      [ "$rc" = 2 ] && other[$script.$launcher]=$((other[$script.$launcher] + 1))
    done
  done
  echo "run $i/$RUNS done" >&2
done

printf '%-8s %-9s %5s %7s %7s %6s\n' script launcher runs aborts other rate
for script in $SCRIPTS; do
  for launcher in rdrun torchrun; do
    a=${aborts[$script.$launcher]}
    printf '%-8s %-9s %5d %7d %7d %5.0f%%\n' "$script" "$launcher" "$RUNS" "$a" \
      "${other[$script.$launcher]}" "$(awk -v a="$a" -v n="$RUNS" 'BEGIN {print 100 * a / n}')"
  done
done
