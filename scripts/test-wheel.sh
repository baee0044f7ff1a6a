#!/usr/bin/env bash
# The Python package of rdrun (issue 40), end to end: builds the wheel with maturin (the range
# pyproject.toml pins), checks its platform tag against the manylinux rules (maturin's own
# auditwheel check), installs it with uv into a fresh venv that reuses the cached torch venv's
# packages (a .pth file names the torch venv's site-packages: no second torch download, nothing
# else fetched; --system-site-packages would only reach the base interpreter's), then runs a real 2-rank DDP job through `rdrun` on the venv's
# PATH and through `python -m rdrun`: exit codes, and a SIGTERM sent to `python -m rdrun`'s pid
# reaching rdrun itself (exec: the same process).
#
# The wheel's cargo build shares ./target and the feature set of scripts/test.sh's release build
# (--no-default-features --features etcd), so after that build only the final link runs.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_PY="$(scripts/torch-venv.sh | tail -1)"
CACHE="${RDRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdrun}"
TOOLS="$CACHE/wheel-tools"
# The build requirement as pyproject.toml pins it (one place for the range).
MATURIN_SPEC="$(sed -n 's/^requires = \["\(maturin[^"]*\)"\]/\1/p' pyproject.toml)"
UV_SPEC="uv>=0.5,<1"
MARKER="$TOOLS/.installed-$MATURIN_SPEC-$UV_SPEC"
if [ ! -f "$MARKER" ]; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet --disable-pip-version-check "$MATURIN_SPEC" "$UV_SPEC"
  touch "$MARKER"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/rdrun-wheel.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "test-wheel: FAIL: $*" >&2; exit 1; }

echo "== wheel: maturin build --release"
t0=$(date +%s)
"$TOOLS/bin/maturin" build --release --auditwheel check --out "$work/dist" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "maturin build"; }
t1=$(date +%s)
wheel="$(ls "$work"/dist/rdrun-*.whl)"
echo "built $(basename "$wheel") in $((t1 - t0)) s"
case "$(basename "$wheel")" in
  *-py3-none-manylinux_2_*_x86_64.whl | *-py3-none-manylinux_2_*_aarch64.whl) ;;
  *) fail "unexpected platform tag: $(basename "$wheel")" ;;
esac
# Only the launcher and the Python package: no benchmark or demo binaries in bin/.
listing="$("$TORCH_PY" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel")"
scripts="$(grep '\.data/scripts/' <<<"$listing" | sed 's|.*/||' | tr '\n' ' ')"
[ "$scripts" = "rdrun " ] || fail "wheel scripts: '$scripts' (want only rdrun)"
grep -qx 'rdrun/__main__.py' <<<"$listing" || fail "no rdrun/__main__.py in the wheel"

echo "== install into a fresh venv beside the cached torch (uv)"
"$TOOLS/bin/uv" venv --quiet --python "$TORCH_PY" "$work/venv"
PY="$work/venv/bin/python"
site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$TORCH_PY" >"$(site "$PY")/rdrun_test_torch.pth"
"$TOOLS/bin/uv" pip install --quiet --offline --python "$PY" "$wheel"
"$PY" -c 'import torch' || fail "torch does not import in the test venv"
[ -x "$work/venv/bin/rdrun" ] || fail "rdrun not in the venv's bin/"
export PATH="$work/venv/bin:$PATH"
[ "$(command -v rdrun)" = "$work/venv/bin/rdrun" ] || fail "rdrun on PATH is $(command -v rdrun)"
v1="$(rdrun --version)"
v2="$("$PY" -m rdrun -V)"
[ "$v1" = "$v2" ] || fail "versions differ: '$v1' vs '$v2'"
echo "$v1"

cat >"$work/job.py" <<'EOF'
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
dist.barrier()
if mode == "exit3" and rank == 1:
    os._exit(3)
if mode == "wait":
    open(os.path.join(out, "ready.%d" % rank), "w").close()
    time.sleep(120)
dist.barrier()
open(os.path.join(out, "done.%d" % rank), "w").close()
dist.destroy_process_group()
# torch 2.15's teardown abort (launcher-tests/torch/README.md): end without finalisation.
sys.stdout.flush()
os._exit(0)
EOF
export PYTHON_EXEC="$PY" RDRUN_WARM_MEMORY=off

echo "== rdrun on PATH: a 2-rank DDP job"
set +e
rdrun --nproc-per-node 2 "$work/job.py" ok "$work" >"$work/ok.log" 2>&1
code=$?
set -e
[ "$code" = 0 ] || { cat "$work/ok.log" >&2; fail "rdrun job exited $code"; }
[ -f "$work/done.0" ] && [ -f "$work/done.1" ] || fail "ranks did not finish"

echo "== python -m rdrun: the same job, rank 1 exits 3"
set +e
"$PY" -m rdrun --nproc-per-node 2 "$work/job.py" exit3 "$work" >"$work/exit3.log" 2>&1
code=$?
set -e
[ "$code" = 3 ] || { cat "$work/exit3.log" >&2; fail "python -m rdrun exited $code, want 3"; }

echo "== python -m rdrun: SIGTERM to its pid reaches rdrun"
"$PY" -m rdrun --nproc-per-node 2 "$work/job.py" wait "$work" >"$work/term.log" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 600); do
  [ -f "$work/ready.0" ] && [ -f "$work/ready.1" ] && break
  sleep 0.1
done
[ -f "$work/ready.0" ] && [ -f "$work/ready.1" ] || { cat "$work/term.log" >&2; fail "ranks not ready"; }
exe="$(readlink "/proc/$pid/exe")"
[ "$exe" = "$work/venv/bin/rdrun" ] || fail "pid $pid runs $exe, not rdrun (no exec?)"
kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
[ "$code" = 143 ] || { cat "$work/term.log" >&2; fail "after SIGTERM: exit $code, want 143"; }
grep -q "SIGTERM" "$work/term.log" || { cat "$work/term.log" >&2; fail "rdrun did not report the SIGTERM"; }

echo "== wheel OK"
