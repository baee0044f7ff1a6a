#!/usr/bin/env bash
# The project's whole test run (what CI runs): formatting, lints, Rust unit and launcher tests,
# then the PyTorch compatibility suite against a pinned torch in a cached venv.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== system tools (iproute2, Slurm, Open MPI, etcd, protoc, zsh/fish: see scripts/ensure-deps.sh)"
scripts/ensure-deps.sh || echo "warning: could not install system tools; namespace tests will skip" >&2

# The launcher tests that run real PyTorch (gloo jobs under Slurm, mpirun, pods in namespaces)
# find the venv in the cache: install it before they run, not only before the PyTorch suite.
if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ]; then
  echo "== PyTorch venv (cached)"
  scripts/torch-venv.sh >/dev/null
fi

# Nothing a test run starts remembers a warm-start list in the user's cache (the tests of the
# memory give a directory of their own; launcher-tests/util.rs `rdrun_bin` does the same).
export RDRUN_WARM_MEMORY=off

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
# Two feature sets cover every cfg: the default (the `not(nccl)` and `not(etcd-tls)` paths) and
# everything on (NCCL through cudarc; etcd over TLS, which implies `etcd`). The build without
# `train` is the release build below.
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features nccl,etcd-tls -- -D warnings
echo "== cargo test"
# The PyTorch suite runs the release launcher (as users do); candle is not needed for it. The
# features are the wheel's (pyproject.toml), so scripts/test-wheel.sh's build reuses this one.
cargo build --release --no-default-features --features etcd --bin rdrun
# etcd v3 is in the default build; its tests run once, below, with TLS and one thread.
cargo test --all-targets -- --test-threads="${RDRUN_TEST_THREADS:-2}" --skip etcd::
# With every feature on, one build: the runtime's NCCL-side logic (backend choice, probe, errors
# without a GPU), the etcd backend's and the config's unit tests with TLS, then the launcher tests
# against a real etcd cluster (they start their own members, in network namespaces or on
# loopback; TLS too; skip without etcd).
cargo test --features nccl,etcd-tls --lib -- runtime:: rendezvous:: config:: --test-threads="${RDRUN_TEST_THREADS:-2}"
cargo test --features nccl,etcd-tls --test launcher etcd:: -- --test-threads=1

if [ "${RDRUN_SKIP_TORCH:-0}" = "1" ]; then
  echo "== PyTorch compatibility suite skipped (RDRUN_SKIP_TORCH=1)"
  exit 0
fi
if [ -x scripts/torch-compat.sh ]; then
  echo "== PyTorch compatibility suite"
  scripts/torch-compat.sh
fi
# The Python package: wheel, install beside the cached torch, `rdrun` and `python -m rdrun` jobs.
echo "== Python package (wheel)"
scripts/test-wheel.sh
