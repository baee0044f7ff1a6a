#!/usr/bin/env bash
# The PyTorch compatibility suite (issue #4): real PyTorch programs and PyTorch's own TCPStore
# client run under rdrun — and, as the reference, under torchrun from the same venv — with pytest.
# Tests live in launcher-tests/torch/. Extra arguments go to pytest (e.g. -k store).
#
# Environment:
#   RDRUN_BIN               rdrun binary to test (default: target/release/rdrun, built if missing,
#                           else target/debug/rdrun)
#   RDRUN_COMPAT_LAUNCHERS  comma list of launchers to run each scenario under (default
#                           "torchrun,rdrun"); the env-parity test always runs both
#
# Exits non-zero on any failure; pytest's closing line gives the counts.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

# The venv (torch + pytest); torch-venv.sh prints its python on the last line of stdout.
PY="$(scripts/torch-venv.sh | tail -n 1)"
if [ ! -x "$PY" ]; then
  echo "torch-compat: error: scripts/torch-venv.sh did not give a python (got '$PY')" >&2
  exit 1
fi

if [ -z "${RDRUN_BIN:-}" ]; then
  if [ ! -x target/release/rdrun ] && [ ! -x target/debug/rdrun ]; then
    echo "== building rdrun (cargo build --release --bin rdrun)"
    cargo build --release --bin rdrun
  fi
  if [ -x target/release/rdrun ]; then
    RDRUN_BIN="$ROOT/target/release/rdrun"
  else
    RDRUN_BIN="$ROOT/target/debug/rdrun"
  fi
fi
export RDRUN_BIN
echo "== torch-compat: rdrun=$RDRUN_BIN python=$PY"

export PYTHONDONTWRITEBYTECODE=1
status=0
# Each launch inside has its own hard timeout; this outer bound only guards against pytest
# itself hanging.
timeout -k 60 "${RDRUN_COMPAT_TIMEOUT:-3000}" \
  "$PY" -m pytest launcher-tests/torch -v -p no:cacheprovider --durations=15 "$@" || status=$?

case "$status" in
  0) ;;
  5)
    echo "torch-compat: error: pytest collected no tests (filter too narrow, or tests missing)" >&2
    status=1
    ;;
  124 | 137)
    echo "torch-compat: error: the suite ran past ${RDRUN_COMPAT_TIMEOUT:-3000}s and was stopped" >&2
    ;;
  *) ;;
esac
exit "$status"
