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
# - the test programs then run side by side: most of a launcher test's time is spent waiting on
#   real processes (Slurm daemons, namespaces, torch's imports in other processes, timeouts), so
#   the launcher tests and the etcd tests (one at a time: each starts an etcd cluster) share the
#   machine instead of queueing; then the PyTorch suite. Each writes its own log, printed whole
#   when all are done; the run fails if any failed.
# - RDRUN_TEST_ALL_AT_ONCE=1 also runs the PyTorch suite beside them, with 4 launcher tests at
#   once: about 4 minutes less on 2 cores (docs/benchmarks.md, "The test run"), but the cores
#   are then saturated for ten minutes, which is where the load-sensitive tests showed up; the
#   default keeps CI's load at what the suite was made for.
#
# Environment: RDRUN_TEST_THREADS (launcher tests at once; default 2, 4 all at once),
# RDRUN_TEST_ALL_AT_ONCE=1, RDRUN_SKIP_TORCH=1 (no PyTorch suite, no torch-backed launcher
# tests' venv, no wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
phase() { echo "== $* (at $(($(date +%s) - started)) s)"; }

phase "system tools (iproute2, Slurm, Open MPI, etcd, protoc, zsh/fish: see scripts/ensure-deps.sh)"
scripts/ensure-deps.sh || echo "warning: could not install system tools; namespace tests will skip" >&2

# The launcher tests that run real PyTorch (gloo jobs under Slurm, mpirun, pods in namespaces)
# find the venv in the cache: install it before they run, not only before the PyTorch suite.
if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ]; then
  phase "PyTorch venv (cached)"
  scripts/torch-venv.sh >/dev/null
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
tests_json="$(mktemp "${TMPDIR:-/tmp}/rdrun-test-bins.XXXXXX")"
logs="$(mktemp -d "${TMPDIR:-/tmp}/rdrun-test-logs.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  rm -rf "$tests_json" "$logs"
}
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

# The unit tests first: seconds, and a broken one should not wait for the slow programs.
phase "unit tests (${#units[@]} programs)"
for u in "${units[@]}"; do
  "$u" --test-threads=2 -q
done

# Side by side. Each runs from the package root, as cargo runs tests.
started_jobs=()
start_job() { # name, command...
  local name="$1"
  shift
  # `set -e` holds in the subshell too: the status is caught, not left to end it unrecorded.
  (
    rc=0
    "$@" >"$logs/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$logs/$name.rc"
  ) &
  pids+=($!)
  started_jobs+=("$name")
}
all_at_once="${RDRUN_TEST_ALL_AT_ONCE:-0}"
torch_suite=0
if [ "${RDRUN_SKIP_TORCH:-0}" != "1" ] && [ -x scripts/torch-compat.sh ]; then torch_suite=1; fi
if [ "$all_at_once" = 1 ]; then threads="${RDRUN_TEST_THREADS:-4}"; else threads="${RDRUN_TEST_THREADS:-2}"; fi
phase "launcher tests ($threads at once) and etcd tests side by side$([ "$all_at_once" = 1 ] && [ "$torch_suite" = 1 ] && echo ", with the PyTorch suite")"
start_job launcher "$launcher" --test-threads="$threads" --skip etcd::
# etcd v3 against real etcd clusters (their own members, in namespaces or on loopback; TLS too).
start_job etcd "$launcher" etcd:: --test-threads=1
if [ "$all_at_once" = 1 ] && [ "$torch_suite" = 1 ]; then
  start_job torch scripts/torch-compat.sh
fi
status=0
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()
for name in "${started_jobs[@]}"; do
  # A job that left no status (killed with its subshell) failed.
  rc="$(cat "$logs/$name.rc" 2>/dev/null || echo "none: the job was killed")"
  echo "======== $name (exit $rc) ========"
  cat "$logs/$name.log" 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    echo "test.sh: $name FAILED (exit $rc)" >&2
    status=1
  fi
done
phase "side-by-side part done"
[ "$status" = 0 ] || exit "$status"

if [ "${RDRUN_SKIP_TORCH:-0}" = "1" ]; then
  phase "PyTorch compatibility suite and wheel skipped (RDRUN_SKIP_TORCH=1)"
  exit 0
fi
if [ "$all_at_once" != 1 ] && [ "$torch_suite" = 1 ]; then
  phase "PyTorch compatibility suite"
  scripts/torch-compat.sh
fi
# The Python package: wheel, install beside the cached torch, `rdrun` and `python -m rdrun` jobs.
phase "Python package (wheel)"
scripts/test-wheel.sh
phase "all passed"
