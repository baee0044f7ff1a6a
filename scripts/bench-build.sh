#!/usr/bin/env bash
# What `cargo install --path .` costs with and without the etcd v3 backend: two clean release
# builds of the default features, one with `--features etcd` added, each in its own fresh target
# directory (crates already fetched, so downloads are not timed). Prints wall and CPU seconds and
# the ratios. CPU seconds (user + system of cargo and every compiler it ran) are the fairer
# measure on a shared machine; wall time is what a user waits.
#   scripts/bench-build.sh [ROUNDS]      (default 1: each build takes minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-1}"
work="$(mktemp -d "${TMPDIR:-/tmp}/rdrun-bench-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cargo fetch --quiet

build() { # $1 = label, rest = extra cargo args; prints "wall cpu"
  local label="$1"; shift
  local dir="$work/$label"
  rm -rf "$dir"
  local t0 t1
  t0=$(date +%s.%N)
  # `time -f` from GNU time when present; otherwise bash's times of the child.
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%U %S' -o "$work/$label.cpu" \
      env CARGO_TARGET_DIR="$dir" cargo build --release --quiet --locked "$@" >/dev/null
    read -r u s <"$work/$label.cpu"
  else
    CARGO_TARGET_DIR="$dir" cargo build --release --quiet --locked "$@" >/dev/null
    read -r u s < <(times | tail -1 | sed 's/m/ /g; s/s//g' | awk '{print $1*60+$2, $3*60+$4}')
  fi
  t1=$(date +%s.%N)
  rm -rf "$dir"
  awk -v a="$t0" -v b="$t1" -v u="$u" -v s="$s" 'BEGIN { printf "%.1f %.1f\n", b - a, u + s }'
}

printf '%-22s %10s %10s\n' build wall_s cpu_s
for ((i = 1; i <= rounds; i++)); do
  read -r dw dc < <(build default)
  printf '%-22s %10s %10s\n' "default" "$dw" "$dc"
  read -r ew ec < <(build etcd --features etcd)
  printf '%-22s %10s %10s\n' "default + etcd" "$ew" "$ec"
  awk -v dw="$dw" -v dc="$dc" -v ew="$ew" -v ec="$ec" \
    'BEGIN { printf "etcd adds: wall %+.0f %%, cpu %+.0f %%\n", (ew / dw - 1) * 100, (ec / dc - 1) * 100 }'
done
