# Shared by the benchmarks that run real PyTorch jobs (bench-recovery.sh, bench-launch-torch.sh):
# sourced, never run. Sets CACHE, PYTHON, TORCHRUN, RDRUN (built in release mode unless given),
# TMP (removed at exit) and MARKS (an empty folder in it); defines `median` (stdin, one number
# per line -> the median, nan when none) and `plot` (draws a results file as a PNG bar chart
# with scripts/plot-bars.py when PLOTS names a folder; matplotlib comes from a venv of its own
# under the cache, made once, so that the PyTorch venv the tests use stays as it is).
# $1: the benchmark's name for messages.
BENCH_NAME="$1"
CACHE="${RDRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdrun}"
PYTHON="${PYTHON:-$CACHE/torch-venv/bin/python}"
TORCHRUN="${TORCHRUN:-$CACHE/torch-venv/bin/torchrun}"
if [ ! -x "$PYTHON" ]; then
  echo "$BENCH_NAME: error: no PyTorch venv at $PYTHON (scripts/torch-venv.sh makes it)" >&2
  exit 1
fi
if [ -z "${RDRUN:-}" ]; then
  cargo build --release --no-default-features --bin rdrun >&2
  RDRUN="$PWD/target/release/rdrun"
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
MARKS="$TMP/marks"
mkdir -p "$MARKS"

median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# plot RESULTS PNG TITLE [UNIT]: RESULTS has lines "GROUP<TAB>SERIES<TAB>VALUE" (UNIT: s).
plot() {
  [ -n "${PLOTS:-}" ] || return 0
  local py="$CACHE/plot-venv/bin/python"
  if ! "$py" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$CACHE/plot-venv" >&2 && "$py" -m pip install --quiet matplotlib >&2
  fi
  mkdir -p "$PLOTS"
  "$py" scripts/plot-bars.py "$1" "$PLOTS/$2" "$3" "${4:-s}" && echo "plot: $PLOTS/$2"
}
