#!/usr/bin/env bash
# Installs the pinned PyTorch used by the compatibility suite and the benchmarks into a venv
# outside the clone, idempotently. Prints the venv's python path on the last line of stdout.
#
# Why a venv outside the clone: torch from PyPI pulls its CUDA libraries (several GB), so it is
# cached once per machine and reused by every run; a marker file records a finished install so a
# half-finished one (interrupted download) is redone rather than trusted.
set -euo pipefail

TORCH_VERSION="${RDRUN_TORCH_VERSION:-2.15.0}"
# pytest drives the compatibility suite (launcher-tests/torch); pinned like torch so that a cached
# venv and a fresh CI machine run the same thing.
PYTEST_VERSION="${RDRUN_PYTEST_VERSION:-9.2.0}"
# py-spy: the hang detector's stack capture (launcher-tests/hang.rs and the suite's hang tests);
# prometheus_client: its text-format parser checks rdrun's /metrics.
PYSPY_VERSION="${RDRUN_PYSPY_VERSION:-0.4.3}"
PROMCLIENT_VERSION="${RDRUN_PROMCLIENT_VERSION:-0.26.0}"
# tqdm: real progress bars on several ranks (--progress, launcher-tests/progress.rs); debugpy:
# --debug-rank's rank waits for a debugger (launcher-tests/debugrank.rs).
TQDM_VERSION="${RDRUN_TQDM_VERSION:-4.70.1}"
DEBUGPY_VERSION="${RDRUN_DEBUGPY_VERSION:-1.8.22}"
CACHE="${RDRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdrun}"
VENV="$CACHE/torch-venv"
# The marker names every pinned package: changing a pin makes the next run install again.
MARKER="$VENV/.rdrun-installed-torch-$TORCH_VERSION-pytest-$PYTEST_VERSION-pyspy-$PYSPY_VERSION-prom-$PROMCLIENT_VERSION-tqdm-$TQDM_VERSION-debugpy-$DEBUGPY_VERSION"

if [ -f "$MARKER" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

PY="${RDRUN_BASE_PYTHON:-$(command -v python3 || true)}"
if [ -z "$PY" ]; then
  echo "torch-venv: error: python3 not found on PATH; install Python 3.10+ first" >&2
  exit 1
fi

mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2 || {
    echo "torch-venv: error: could not create a venv at $VENV with $PY (is the venv module installed?)" >&2
    exit 1
  }
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || true
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    "torch==$TORCH_VERSION" numpy "pytest==$PYTEST_VERSION" "py-spy==$PYSPY_VERSION" \
    "prometheus_client==$PROMCLIENT_VERSION" "tqdm==$TQDM_VERSION" "debugpy==$DEBUGPY_VERSION" >&2; then
  echo "torch-venv: error: could not install torch==$TORCH_VERSION and pytest==$PYTEST_VERSION into $VENV (network or disk?)" >&2
  exit 1
fi
"$VENV/bin/python" -c 'import torch, torch.distributed as d, pytest, prometheus_client, tqdm, debugpy; assert d.is_available()' >&2 || {
  echo "torch-venv: error: torch/pytest installed into $VENV but do not import" >&2
  exit 1
}
touch "$MARKER"
echo "$VENV/bin/python"
