#!/usr/bin/env bash
# A throw-away etcd v3 cluster on loopback, for the etcd rendezvous tests, benchmarks and trying
# `--rdzv-backend etcd-v3` by hand. Members are tracked by PID (never by name).
#
#   scripts/etcd-cluster.sh start DIR [N]   start N members (default 3) on free 127.0.0.1 ports,
#                                           data under DIR; prints the endpoint list (h:p,h:p,..)
#                                           and writes it to DIR/endpoints; PIDs in DIR/pid.I
#   scripts/etcd-cluster.sh kill DIR I      SIGKILL member I (0-based)
#   scripts/etcd-cluster.sh stop DIR        SIGTERM every member, wait, remove DIR's data
#
# Needs etcd 3.4+ (`etcd`, `etcdctl`; Debian: etcd-server etcd-client).
set -euo pipefail

die() { echo "etcd-cluster.sh: $*" >&2; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

cmd_start() {
  local dir=$1 n=${2:-3} i cluster="" eps=""
  command -v etcd >/dev/null || die "etcd not found (install etcd-server)"
  mkdir -p "$dir"
  local -a cp pp
  for ((i = 0; i < n; i++)); do cp[i]=$(free_port); pp[i]=$(free_port); done
  for ((i = 0; i < n; i++)); do
    cluster+="${cluster:+,}m$i=http://127.0.0.1:${pp[i]}"
    eps+="${eps:+,}127.0.0.1:${cp[i]}"
  done
  for ((i = 0; i < n; i++)); do
    etcd --name "m$i" --data-dir "$dir/m$i.data" \
      --listen-client-urls "http://127.0.0.1:${cp[i]}" --advertise-client-urls "http://127.0.0.1:${cp[i]}" \
      --listen-peer-urls "http://127.0.0.1:${pp[i]}" --initial-advertise-peer-urls "http://127.0.0.1:${pp[i]}" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "t$$" \
      --heartbeat-interval 50 --election-timeout 500 --log-level error \
      >"$dir/m$i.log" 2>&1 &
    echo $! >"$dir/pid.$i"
  done
  echo "$eps" >"$dir/endpoints"
  local deadline=$((SECONDS + 30))
  until ETCDCTL_API=3 etcdctl --endpoints="$eps" --command-timeout=2s endpoint health >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { cmd_stop "$dir"; die "cluster not healthy after 30 s"; }
    sleep 0.2
  done
  echo "$eps"
}

cmd_kill() {
  local dir=$1 i=$2
  [ -f "$dir/pid.$i" ] || die "no member $i in $dir"
  kill -KILL "$(cat "$dir/pid.$i")" 2>/dev/null || true
}

cmd_stop() {
  local dir=$1 f pid
  for f in "$dir"/pid.*; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  rm -rf "$dir"/m*.data
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) die "usage: etcd-cluster.sh start DIR [N] | kill DIR I | stop DIR" ;;
esac
