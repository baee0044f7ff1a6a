#!/usr/bin/env bash
# Test harness: N network namespaces ("nodes") joined by veth pairs to a bridge that lives in its
# own hub namespace, so nothing is added to the root namespace's network. Node i (0-based) gets
# 10.231.0.(i+1)/24 and fd00:231::(i+1)/64 on its eth0, plus loopback. Used by the multi-node
# rendezvous tests (launcher-tests/rendezvous.rs) and by hand:
#
#   scripts/netns.sh check                 exit 0 if namespaces can be made here, else 77 + reason
#   scripts/netns.sh up TAG N              create namespaces rdrun-TAG-hub, rdrun-TAG-0..N-1
#   scripts/netns.sh exec TAG I CMD...     run CMD inside node I
#   scripts/netns.sh cut TAG I | heal TAG I   take node I's link down / up (cable pull)
#   scripts/netns.sh slow TAG I RATE       rate-limit node I's egress (tc tbf, e.g. 20mbit); a
#                                          slow NIC or link. (tc netem, for delay, is not on every
#                                          kernel; tbf is.)
#   scripts/netns.sh down TAG              kill every process inside them, delete everything
#   scripts/netns.sh run N CMD...          up with a fresh tag, run CMD (env RDRUN_NETNS_TAG,
#                                          RDRUN_NETNS_N, RDRUN_NETNS_ADDRS), always clean up
#   scripts/netns.sh reap                  delete namespaces of harnesses whose owner pid is gone
#
# Needs root and iproute2 (`ip`); scripts/ensure-deps.sh installs iproute2. TAG: [a-z0-9]{1,10}.
set -euo pipefail

SUBNET4=10.231.0
SUBNET6=fd00:231:
OWNER_DIR=${RDRUN_NETNS_STATE:-/run/rdrun-netns}

die() { echo "netns.sh: $*" >&2; exit 1; }
hub() { echo "rdrun-$1-hub"; }
node() { echo "rdrun-$1-$2"; }

check_tag() { [[ "$1" =~ ^[a-z0-9]{1,10}$ ]] || die "bad tag '$1' (want [a-z0-9]{1,10})"; }

cmd_check() {
  if ! command -v ip >/dev/null 2>&1; then
    echo "network namespaces unavailable: iproute2 'ip' not found (run scripts/ensure-deps.sh)"; exit 77
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "network namespaces unavailable: not root"; exit 77
  fi
  local probe="rdrun-probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "network namespaces unavailable: 'ip netns add' failed (no CAP_SYS_ADMIN?)"; exit 77
  fi
  local ok=1
  ip -n "$probe" link add br0 type bridge 2>/dev/null || ok=0
  ip -n "$probe" link add v0 type veth peer name v1 2>/dev/null || ok=0
  ip netns del "$probe" 2>/dev/null || true
  if [ "$ok" != 1 ]; then
    echo "network namespaces unavailable: cannot create bridge/veth links"; exit 77
  fi
  echo "ok"
}

cmd_down() {
  local tag=$1 ns pids
  check_tag "$tag"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^rdrun-$tag-" || true); do
    # Only processes inside our own namespaces: we created them for this harness.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^rdrun-$tag-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$OWNER_DIR/$tag"
}

cmd_up() {
  local tag=$1 n=$2 i h
  check_tag "$tag"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "bad node count '$n'"
  h=$(hub "$tag")
  mkdir -p "$OWNER_DIR"
  echo "${RDRUN_NETNS_OWNER:-$PPID}" >"$OWNER_DIR/$tag"
  # On any failure half-way, remove what was made.
  UP_TAG=$tag
  trap 'cmd_down "$UP_TAG"' ERR
  ip netns add "$h"
  ip -n "$h" link set lo up
  ip -n "$h" link add br0 type bridge
  ip -n "$h" link set br0 up
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(node "$tag" "$i")
    ip netns add "$ns"
    ip -n "$h" link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n "$h" link set "v$i" master br0
    ip -n "$h" link set "v$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET4.$((i + 1))/24" dev eth0
    # nodad: the address is usable at once (no duplicate address detection delay).
    ip -n "$ns" addr add "$SUBNET6:$((i + 1))/64" dev eth0 nodad
    ip -n "$ns" link set eth0 up
  done
  trap - ERR
}

addrs() {
  local n=$1 i out=""
  for ((i = 0; i < n; i++)); do out+="${out:+,}$SUBNET4.$((i + 1))"; done
  echo "$out"
}

cmd_run() {
  local n=$1; shift
  [ $# -ge 1 ] || die "run: missing command"
  # Global (not local): the EXIT trap runs after this function returned.
  RUN_TAG="r$$"
  trap 'cmd_down "$RUN_TAG"' EXIT
  trap 'exit 130' INT TERM
  RDRUN_NETNS_OWNER=$$ cmd_up "$RUN_TAG" "$n"
  RDRUN_NETNS_TAG=$RUN_TAG RDRUN_NETNS_N=$n RDRUN_NETNS_ADDRS=$(addrs "$n") "$@"
}

cmd_reap() {
  local f tag pid
  [ -d "$OWNER_DIR" ] || return 0
  for f in "$OWNER_DIR"/*; do
    [ -e "$f" ] || continue
    tag=$(basename "$f"); pid=$(cat "$f" 2>/dev/null || echo 0)
    if ! kill -0 "$pid" 2>/dev/null; then cmd_down "$tag"; fi
  done
}

sub=${1:-}; shift || true
case "$sub" in
  check) cmd_check ;;
  up) [ $# -eq 2 ] || die "usage: up TAG N"; cmd_up "$1" "$2" ;;
  down) [ $# -eq 1 ] || die "usage: down TAG"; cmd_down "$1" ;;
  exec) [ $# -ge 3 ] || die "usage: exec TAG I CMD..."; check_tag "$1"; ns=$(node "$1" "$2"); shift 2; exec ip netns exec "$ns" "$@" ;;
  cut) [ $# -eq 2 ] || die "usage: cut TAG I"; check_tag "$1"; ip -n "$(hub "$1")" link set "v$2" down ;;
  heal) [ $# -eq 2 ] || die "usage: heal TAG I"; check_tag "$1"; ip -n "$(hub "$1")" link set "v$2" up ;;
  slow) [ $# -eq 3 ] || die "usage: slow TAG I RATE"; check_tag "$1"; ip netns exec "$(node "$1" "$2")" tc qdisc add dev eth0 root tbf rate "$3" burst 32kbit latency 50ms ;;
  run) [ $# -ge 2 ] || die "usage: run N CMD..."; cmd_run "$@" ;;
  reap) cmd_reap ;;
  *) die "usage: netns.sh check|up|down|exec|cut|heal|slow|run|reap (see the header)" ;;
esac
