#!/usr/bin/env bash
# Installs the system tools the test suite needs, idempotently (nothing happens when present):
# - iproute2 (`ip`) for the network-namespace multi-node tests (scripts/netns.sh);
# - slurm-client (`scontrol`, the differential oracle of the Slurm hostlist parser), and slurmctld,
#   slurmd and munge for the real two-node Slurm cluster the cluster tests start in namespaces;
# - openmpi-bin for the real `mpirun` launches;
# - etcd-server (and etcdctl) for the etcd v3 rendezvous tests against a real etcd;
# - protobuf-compiler and libprotobuf-dev (`protoc` and the well-known .proto files) for building
#   the etcd client's generated code;
# - zsh and fish, so that the generated shell completions are loaded by the real shells, and tmux,
#   the terminal those shells and a pdb session on one rank are driven through;
# - strace, a real wrapper for the `--wrap` tests;
# - faketime (libfaketime), to run one agent with its clock off for the clock health check.
# Tests that need a tool that is still missing skip with a message naming it.
set -euo pipefail

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v scontrol >/dev/null 2>&1 || missing+=(slurm-client)
command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
[ -e /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)
# The terminal tests (completions, pdb on one rank, tqdm bars of 4 ranks) drive real shells through tmux; --wrap is
# tested with strace as a real wrapper.
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v strace >/dev/null 2>&1 || missing+=(strace)
# libfaketime: one agent's clock set 30 s ahead for the `clock` health check's real test.
command -v faketime >/dev/null 2>&1 || missing+=(faketime)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-deps: missing ${missing[*]}; install them (needs root and apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
