#!/usr/bin/env bash
# Test harness: a real Slurm cluster on one machine. Debian's munged, slurmctld and one slurmd
# per node, each node in its own network namespace (scripts/netns.sh: veth pairs on a bridge in
# a hub namespace) and its own UTS namespace whose hostname is the node's name, so slurmd finds
# itself by hostname as on a real cluster. The controller ("ctl", 10.231.0.254 on the bridge)
# and munged live in the hub namespace. Every node and the controller see a private /etc/hosts
# (bind-mounted in their own mount namespace) that names all of them. Nothing is written outside
# the cluster directory; nothing is added to the root namespace's network.
#
#   scripts/slurm-cluster.sh check            exit 0 if a cluster can run here, else 77 + reason
#   scripts/slurm-cluster.sh up DIR NAME...   start a cluster whose nodes are NAME... (in slurm.conf
#                                             order; 1..16 names) in DIR (created; must not exist)
#   scripts/slurm-cluster.sh exec DIR CMD...  run CMD on the controller host (its network, hostname
#                                             and hosts file; SLURM_CONF set; cwd kept): the
#                                             "login node" where srun/sbatch/salloc run
#   scripts/slurm-cluster.sh down DIR         stop every daemon by PID, kill what is left inside
#                                             the namespaces, delete them, remove DIR (idempotent)
#   scripts/slurm-cluster.sh reap             `down` every cluster whose owner process is gone
#
# Node i (0-based) has 10.231.0.(i+1). Nodes have CPUs=4 (config_overrides: the machine may have
# fewer), ProctrackType=proctrack/linuxproc and TaskPlugin=task/none, so no cgroup is needed.
# Per-node spool, pid and log files use slurm.conf's %n. The owner (RDRUN_SLURM_OWNER, default the
# caller's pid) is recorded so that `reap` can clean up after a killed test. `up` is bounded
# (RDRUN_SLURM_UP_TIMEOUT seconds, default 60) and cleans up after itself on failure.
# Needs root, iproute2, util-linux (unshare, nsenter) and Debian's slurmctld, slurmd, munge and
# slurm-client (scripts/ensure-deps.sh installs them).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
NETNS="$HERE/netns.sh"
CTL_ADDR=10.231.0.254
STATE_DIR=${RDRUN_SLURM_STATE:-/run/rdrun-slurm}

die() { echo "slurm-cluster.sh: $*" >&2; exit 1; }

cmd_check() {
  local t
  for t in munged munge slurmctld slurmd srun sbatch salloc scontrol sinfo unshare nsenter; do
    if ! command -v "$t" >/dev/null 2>&1; then
      echo "slurm cluster unavailable: '$t' not found (run scripts/ensure-deps.sh)"; exit 77
    fi
  done
  local why
  if ! why=$("$NETNS" check); then echo "slurm cluster unavailable: $why"; exit 77; fi
  if ! unshare --uts --mount true 2>/dev/null; then
    echo "slurm cluster unavailable: cannot create UTS/mount namespaces (unshare failed)"; exit 77
  fi
  echo ok
}

check_name() {
  [[ "$1" =~ ^[a-z][a-z0-9-]{0,30}$ ]] || die "bad node name '$1' (want [a-z][a-z0-9-]{0,30})"
  [ "$1" != ctl ] || die "node name 'ctl' is the controller's"
}

# Starts "$@" in the background inside network namespace $1 under new UTS and mount namespaces
# with hostname $2 and the cluster's hosts file; records its pid in $DIR/pids/$3. The daemon runs
# in the foreground (-D/-F) so that this pid is the daemon's own (setsid, nsenter and unshare exec
# in place); its stdio goes to $DIR/log/$3.out, never to the caller's pipes. nsenter, not
# `ip netns exec`: the latter remounts /sys, hiding /sys/fs/cgroup, which slurmd 22.05 probes.
start_in() {
  local ns=$1 host=$2 id=$3; shift 3
  setsid nsenter --net="/var/run/netns/$ns" unshare --uts --mount --propagation private \
    sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
    sh "$host" "$DIR/hosts" "$@" \
    </dev/null >"$DIR/log/$id.out" 2>&1 &
  echo $! >"$DIR/pids/$id"
}

write_conf() {
  local names=("$@") i
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost"
    echo "$CTL_ADDR ctl"
    for ((i = 0; i < ${#names[@]}; i++)); do echo "10.231.0.$((i + 1)) ${names[$i]}"; done
  } >"$DIR/hosts"
  : >"$DIR/plugstack.conf"
  # slurmd 22.05 always loads a cgroup plugin. Naming v1 skips the autodetection, and the mount
  # point is an empty directory of ours: nothing here uses cgroups (proctrack/linuxproc,
  # task/none), and the machine's cgroup tree is never touched.
  mkdir -p "$DIR/cgroup"
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s\nCgroupAutomount=no\n' "$DIR/cgroup" >"$DIR/cgroup.conf"
  cat >"$DIR/slurm.conf" <<EOF
ClusterName=rdtest
SlurmctldHost=ctl($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PlugStackConfig=$DIR/plugstack.conf
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=10
EOF
  {
    for ((i = 0; i < ${#names[@]}; i++)); do
      echo "NodeName=${names[$i]} NodeAddr=10.231.0.$((i + 1)) CPUs=4 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >>"$DIR/slurm.conf"
}

# Runs on the controller host: the hub namespace plus the controller's UTS and mount namespaces.
ctl_exec() {
  local pid
  pid=$(cat "$DIR/pids/slurmctld" 2>/dev/null) || die "no controller in $DIR"
  kill -0 "$pid" 2>/dev/null || die "the controller (pid $pid) is not running; see $DIR/log"
  nsenter --target "$pid" --net --uts --mount --wd="$PWD" \
    env SLURM_CONF="$DIR/slurm.conf" "$@"
}

wait_until() {
  local what=$1 deadline=$2; shift 2
  local f dead
  until "$@" >/dev/null 2>&1; do
    dead=""
    for f in "$DIR"/pids/*; do kill -0 "$(cat "$f")" 2>/dev/null || dead+=" $(basename "$f")"; done
    if [ -n "$dead" ] || [ "$(date +%s)" -ge "$deadline" ]; then
      if [ -n "$dead" ]; then what="$what (exited:$dead)"; fi
      echo "slurm-cluster.sh: failed waiting for $what; logs:" >&2
      tail -n 20 "$DIR"/log/* >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.2
  done
}

all_idle() {
  local n=$1 out
  out=$(ctl_exec sinfo -h -N -o '%T' 2>/dev/null) || return 1
  [ "$(grep -cx 'idle' <<<"$out")" = "$n" ]
}

cmd_up() {
  DIR=$1; shift
  [ $# -ge 1 ] && [ $# -le 16 ] || die "up: give 1..16 node names"
  local n
  for n in "$@"; do check_name "$n"; done
  [ "$(printf '%s\n' "$@" | sort | uniq -d)" = "" ] || die "up: duplicate node name"
  [ ! -e "$DIR" ] || die "up: $DIR exists"
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  chmod 700 "$DIR"
  mkdir -p "$DIR"/{munge,ctld,run,log,pids,spool}
  for n in "$@"; do mkdir -p "$DIR/spool/$n"; done
  # A namespace tag unused so far ([a-z0-9]{1,10} for netns.sh).
  local tag i
  for ((i = 0; ; i++)); do
    tag=$(printf 's%x%x' $$ "$i")
    ip netns list 2>/dev/null | awk '{print $1}' | grep -q "^rdrun-$tag-" || break
  done
  echo "$tag" >"$DIR/tag"
  mkdir -p "$STATE_DIR"
  echo "${RDRUN_SLURM_OWNER:-$PPID} $DIR" >"$STATE_DIR/$tag"
  trap 'cmd_down "$DIR" >/dev/null 2>&1 || true' ERR
  local deadline=$(($(date +%s) + ${RDRUN_SLURM_UP_TIMEOUT:-60}))

  RDRUN_NETNS_OWNER=${RDRUN_SLURM_OWNER:-$PPID} "$NETNS" up "$tag" $#
  local hub="rdrun-$tag-hub"
  ip -n "$hub" addr add "$CTL_ADDR/24" dev br0
  write_conf "$@"

  # munged: a fresh key, everything in DIR; root needs --force.
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  chmod 700 "$DIR/munge"
  start_in "$hub" ctl munged munged -F --force --key-file="$DIR/munge/munge.key" \
    --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" --num-threads=4
  wait_until munged "$deadline" sh -c "munge -n -S '$DIR/munge/munge.socket' | unmunge -S '$DIR/munge/munge.socket'"

  start_in "$hub" ctl slurmctld slurmctld -D -i -f "$DIR/slurm.conf"
  wait_until slurmctld "$deadline" ctl_exec scontrol ping
  for ((i = 0; i < $#; i++)); do
    local name=${*:$((i + 1)):1}
    start_in "rdrun-$tag-$i" "$name" "slurmd-$name" slurmd -D -f "$DIR/slurm.conf"
  done
  wait_until "every node idle" "$deadline" all_idle $#
  trap - ERR
}

# Sends SIGTERM to each recorded daemon, waits up to 10 s for all, then SIGKILLs what is left.
stop_pids() {
  local f pid pids=() i
  for f in "$DIR"/pids/*; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

cmd_down() {
  DIR=$1
  [ -d "$DIR" ] || return 0
  DIR=$(cd "$DIR" && pwd)
  stop_pids
  local tag
  tag=$(cat "$DIR/tag" 2>/dev/null || true)
  # netns.sh down kills anything left inside the namespaces (slurmstepd, tasks), then deletes them.
  if [ -n "$tag" ]; then
    "$NETNS" down "$tag"
    rm -f "$STATE_DIR/$tag"
  fi
  rm -rf "$DIR"
}

cmd_reap() {
  local f owner dir
  [ -d "$STATE_DIR" ] || return 0
  for f in "$STATE_DIR"/*; do
    [ -e "$f" ] || continue
    read -r owner dir <"$f" || true
    if ! kill -0 "${owner:-0}" 2>/dev/null; then
      if [ -n "${dir:-}" ] && [ -d "$dir" ]; then cmd_down "$dir"; else
        "$NETNS" down "$(basename "$f")"; rm -f "$f"
      fi
    fi
  done
}

sub=${1:-}; shift || true
case "$sub" in
  check) cmd_check ;;
  up) [ $# -ge 2 ] || die "usage: up DIR NAME..."; cmd_up "$@" ;;
  exec) [ $# -ge 2 ] || die "usage: exec DIR CMD..."; DIR=$(cd "$1" && pwd); shift; ctl_exec "$@" ;;
  down) [ $# -eq 1 ] || die "usage: down DIR"; cmd_down "$1" ;;
  reap) cmd_reap ;;
  *) die "usage: slurm-cluster.sh check|up|exec|down|reap (see the header)" ;;
esac
