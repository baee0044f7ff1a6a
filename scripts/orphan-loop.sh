#!/usr/bin/env bash
# The orphan loop of issue 10: how many tries leave a process (or the run's cgroup) behind when
# rdrun dies by SIGKILL, per grandchild kind and scenario.
#
# Usage: scripts/orphan-loop.sh [-n TRIES] [-b RDRUN] [-k "KINDS"] [-s "SCENARIOS"] [-c CGROUP]
#   KINDS:     plain setsid double double-setsid (launcher-tests/workers/spawn_escapee)
#   SCENARIOS: kill-rdrun kill-group (steady state: every grandchild exists),
#              startup (SIGKILL at 0-40 ms, rdrun and group alternately),
#              restart (workers fail after 0.1 s under --max-restarts; SIGKILL once a restart
#              happened, at 0-130 ms, rdrun and group alternately),
#              shm (SIGKILL during `train --backend shm` start-up: counts segments left in /dev/shm
#              and world-readable ones; needs the train binary next to RDRUN)
#   CGROUP:    value of RDRUN_CGROUP for rdrun (auto, v2, v1, off)
# Survivors are found by a unique RDRUN_TEST_TAG in /proc/<pid>/environ, killed by PID, counted.
# Prints one line per (scenario, kind): tries with survivors / tries.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
n=100; bin="$here/target/debug/rdrun"; kinds="plain setsid double double-setsid"
scenarios="kill-rdrun kill-group startup restart"; cg=auto
while getopts "n:b:k:s:c:" o; do
  case $o in n) n=$OPTARG;; b) bin=$OPTARG;; k) kinds=$OPTARG;; s) scenarios=$OPTARG;; c) cg=$OPTARG;;
  *) echo "usage: $0 [-n TRIES] [-b RDRUN] [-k KINDS] [-s SCENARIOS] [-c CGROUP]" >&2; exit 2;; esac
done
[ -x "$bin" ] || { echo "$0: no rdrun binary at $bin (cargo build first)" >&2; exit 2; }
worker="$here/launcher-tests/workers/spawn_escapee"
cgparents=$(awk '$9=="cgroup2"{print $5} $9=="cgroup" && $11 ~ /freezer/{print $5}' /proc/self/mountinfo)
set -m  # every background job in its own process group: the group can be killed alone

tagged() { grep -l "RDRUN_TEST_TAG=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
cgroups_of() { for p in $cgparents; do ls -d "$p/$(sed -n 's/^0:://p' /proc/self/cgroup | sed 's|^/||')"/rdrun-"$1"-* 2>/dev/null; done; }

# leftovers PID TAG: 0 when everything of the run is gone within 15 s; else kills and returns 1.
leftovers() {
  wait "$1" 2>/dev/null
  local end=$((SECONDS + 15)) left
  while :; do
    left=$(tagged "$2"; cgroups_of "$1")
    [ -z "$left" ] && return 0
    if [ $SECONDS -ge $end ]; then
      for p in $(tagged "$2"); do kill -9 "$p" 2>/dev/null; done
      for d in $(cgroups_of "$1"); do [ -f "$d/cgroup.kill" ] && echo 1 > "$d/cgroup.kill"; sleep 0.2; rmdir "$d" 2>/dev/null; done
      return 1
    fi
    sleep 0.02
  done
}

lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
wait_lines() { local end=$((SECONDS + 30)); while [ "$(lines "$1")" -lt "$2" ]; do [ $SECONDS -ge $end ] && return 1; sleep 0.005; done; }

one_try() { # scenario kind i -> returns 0 clean, 1 survivors
  local sc=$1 kind=$2 i=$3 dir tag pid fail="" extra=()
  dir=$(mktemp -d); tag="loop-$$-$sc-$kind-$i"
  if [ "$sc" = restart ]; then fail=fail; extra=(--max-restarts=100000 --shutdown-timeout=1); fi
  RDRUN_TEST_TAG=$tag RDRUN_CGROUP=$cg OMP_NUM_THREADS=1 "$bin" --standalone --nproc-per-node=2 \
    --no-python "${extra[@]}" "$worker" "$dir" "$kind" $fail >/dev/null 2>&1 </dev/null &
  pid=$!
  local target=$pid; [ $((i % 2)) = 1 ] && target=-$pid
  case $sc in
    kill-rdrun) wait_lines "$dir/gpids" 2; [ "$cg" = off ] && sleep 0.5; target=$pid ;;
    kill-group) wait_lines "$dir/gpids" 2; [ "$cg" = off ] && sleep 0.5; target=-$pid ;;
    startup) sleep "0.0$(printf %02d $(( (i * 41) % 40 )))" ;;
    restart) wait_lines "$dir/pids" 4; sleep "0.$(printf %03d $(( (i * 131) % 130 )))" ;;
  esac
  kill -9 -- "$target" 2>/dev/null
  leftovers "$pid" "$tag"; local rc=$?
  rm -rf "$dir"; return $rc
}

shm_loop() {
  local train; train="$(dirname "$bin")/train"
  [ -x "$train" ] || { echo "shm: no train binary at $train (cargo build --bin train)"; return; }
  local left=0 readable=0 i
  for i in $(seq "$n"); do
    local id="shmloop-$$-$i" tag="loop-$$-shm-$i" prefix
    # Static single node with a run-specific id (segments are named after it).
    RDRUN_TEST_TAG=$tag RDRUN_CGROUP=$cg "$bin" --nproc-per-node=2 --master-port=$((20000 + RANDOM % 20000)) \
      --rdzv-id="$id" --no-python "$train" --backend shm --epochs 1000 \
      >/dev/null 2>&1 </dev/null &
    local pid=$!
    sleep "0.$(printf %03d $(( (i * 37) % 400 )))"
    kill -9 -- "-$pid" 2>/dev/null
    leftovers "$pid" "$tag"
    sleep 0.1
    prefix="rdrun-$id."
    if ls /dev/shm/"$prefix"* >/dev/null 2>&1; then
      left=$((left + 1))
      for f in /dev/shm/"$prefix"*; do [ "$(stat -c %a "$f")" != 600 ] && readable=$((readable + 1)); rm -f "$f"; done
    fi
  done
  echo "shm: $left/$n tries left a segment ($readable world-readable)"
}

for sc in $scenarios; do
  if [ "$sc" = shm ]; then shm_loop; continue; fi
  for kind in $kinds; do
    bad=0; t0=$SECONDS
    for i in $(seq "$n"); do one_try "$sc" "$kind" "$i" || bad=$((bad + 1)); done
    echo "$sc $kind: $bad/$n tries left processes or cgroups ($((SECONDS - t0)) s)"
  done
done
