#!/usr/bin/env bash
# The project's whole test run (what CI runs): formatting, lints, Rust unit and launcher tests,
# the PyTorch compatibility suite against a pinned torch in a cached venv, and the Python wheel.
#
# Built to take minutes, not half an hour, on a 2-core machine (docs/benchmarks.md, "The test
# run"):
# - the crate is compiled as few times as the features allow: one clippy over every feature that
#   builds together (default + nccl + etcd-tls), one test build with the same features (every
#   unit test, the launcher tests and the etcd ones), and the release build that the PyTorch suite
#   and the wheel share (the wheel's features: no candle);
# - the slow tests then run as one pool of small jobs (scripts/run-tests.py): every launcher test
#   is its own process, the etcd tests one at a time (each starts its own etcd cluster), the
#   PyTorch suite one file at a time, and RDRUN_TEST_JOBS (default 3) of them at once, longest
#   first by the times the last run recorded (cached beside the torch venv). Most of a launcher
#   test's time is spent waiting on real processes (Slurm daemons, namespaces, torch's imports in
#   other processes, timeouts), so they share the machine instead of queueing; the pool keeps
#   the load at what the old layout ran (two launcher tests beside one etcd test) and has no tail
#   of slow tests that happen to sort last.
# - Every file the tests and the processes they start leave in the temp dir (rdrun's hang
#   captures without a log dir, torch's `torchelastic_*` dirs under torchrun) goes with the
#   run: TMPDIR is a fresh directory, removed at the end.
#
# Environment: RDRUN_TEST_JOBS (jobs at once, default 3), RDRUN_SKIP_TORCH=1 (no PyTorch suite,
# no torch-backed launcher tests' venv, no wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
phase() { echo "== $* (at $(($(date +%s) - started)) s)"; }

phase "system tools (iproute2, Slurm, Open MPI, etcd, protoc, zsh/fish: see scripts/ensure-deps.sh)"
scripts/ensure-deps.sh || echo "warning: could not install system tools; namespace tests will skip" >&2

# The launcher tests that run real PyTorch (gloo jobs under Slurm, mpirun, pods in namespaces)
# find the venv in the cache: install it before they run, not only before the PyTorch suite.
torch_py=""
if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ]; then
  phase "PyTorch venv (cached)"
  torch_py="$(scripts/torch-venv.sh | tail -n 1)"
fi

# Nothing a test run starts remembers a warm-start list in the user's cache (the tests of the
# memory give a directory of their own; launcher-tests/util.rs `rdrun_bin` does the same).
export RDRUN_WARM_MEMORY=off

FEATURES="nccl,etcd-tls"
phase "cargo fmt --check"
cargo fmt --all -- --check
# One clippy: every feature that can build together (NCCL through cudarc; etcd over TLS, which
# implies `etcd`; the default `train`). The few `cfg(not(feature = ...))` fallbacks (the runtime
# without NCCL, etcd without TLS) are compiled by the release build below, not linted.
phase "cargo clippy --features $FEATURES"
cargo clippy --all-targets --features "$FEATURES" -- -D warnings

# The PyTorch suite runs the release launcher (as users do); candle is not needed for it. The
# features are the wheel's (pyproject.toml), so scripts/test-wheel.sh's build reuses this one.
phase "cargo build --release (the PyTorch suite's and the wheel's launcher)"
cargo build --release --no-default-features --features etcd --bin rdrun
phase "cargo test --no-run --features $FEATURES"
# Short: socket paths under it (the warm template's, the FileTimer FIFO's) have a length limit.
run_tmp="$(mktemp -d "${TMPDIR:-/tmp}/rdt.XXXXXX")"
tests_json="$run_tmp/test-bins.json"
cleanup() { rm -rf "$run_tmp"; }
trap cleanup EXIT
cargo test --all-targets --features "$FEATURES" --no-run --message-format=json >"$tests_json"
# Every test program the build made: (target name, path).
mapfile -t programs < <(python3 - "$tests_json" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"] + "\t" + m["executable"])
EOF
)
launcher=""
units=()
for entry in "${programs[@]}"; do
  name="${entry%%$'\t'*}"
  path="${entry#*$'\t'}"
  if [ "$name" = launcher ]; then launcher="$path"; else units+=("$path"); fi
done
if [ -z "$launcher" ] || [ "${#units[@]}" -eq 0 ]; then
  echo "test.sh: error: the test build gave no launcher or unit test program" >&2
  exit 1
fi
# From here on, what the tests leave in the temp dir is removed with the run.
export TMPDIR="$run_tmp"

# The unit tests first: seconds, and a broken one should not wait for the slow programs.
phase "unit tests (${#units[@]} programs)"
for u in "${units[@]}"; do
  "$u" --test-threads=2 -q
done

# The pool: launcher tests, etcd tests and the PyTorch suite, longest first.
pool=(scripts/run-tests.py --launcher "$launcher" --jobs "${RDRUN_TEST_JOBS:-3}"
  --times "${RDRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdrun}/test-times.json")
if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ]; then
  RDRUN_BIN="$(pwd)/target/release/rdrun"
  export RDRUN_BIN PYTHONDONTWRITEBYTECODE=1
  pool+=(--torch-python "$torch_py")
fi
phase "launcher tests, etcd tests$([ "${RDRUN_SKIP_TORCH:-0}" != 1 ] && echo " and the PyTorch suite"): ${RDRUN_TEST_JOBS:-3} at once"
"${pool[@]}"
phase "pool done"

if [ "${RDRUN_SKIP_TORCH:-0}" = "1" ]; then
  phase "wheel skipped (RDRUN_SKIP_TORCH=1)"
  exit 0
fi
# The Python package: wheel, install beside the cached torch, `rdrun` and `python -m rdrun` jobs.
phase "Python package (wheel)"
scripts/test-wheel.sh
phase "all passed"
