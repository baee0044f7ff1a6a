#!/usr/bin/env bash
# Installs the system tools the test suite needs, idempotently (nothing happens when present):
# iproute2 (`ip`) for the network-namespace multi-node tests (scripts/netns.sh), and slurm-client
# (`scontrol`) as the differential oracle of the Slurm hostlist parser (src/cluster/hostlist.rs; it needs
# no controller, only a generated slurm.conf).
set -euo pipefail

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v scontrol >/dev/null 2>&1 || missing+=(slurm-client)

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
