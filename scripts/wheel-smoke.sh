#!/usr/bin/env bash
# Test what users install: build a wheel from this checkout, check that it carries every file of
# probes/, tasks/ and cli/, install it (not editable) into a new, clean virtual environment and
# run the smoke checks from outside the repository. The dependencies are the locked versions
# (LOCK, default constraints.txt; LOCK= installs from pyproject.toml's ranges alone).
#   usage: scripts/wheel-smoke.sh [WORKDIR]   (default: build/wheel-smoke; PYTHON, TORCH, LOCK as in the Makefile)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mkdir -p "${1:-$ROOT/build/wheel-smoke}" && cd "${1:-$ROOT/build/wheel-smoke}" && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch==2.13.0}"
LOCK="${LOCK-constraints.txt}"
PIN=()
if [ -n "$LOCK" ]; then
    case "$LOCK" in /*) ;; *) LOCK="$ROOT/$LOCK" ;; esac
    PIN=(-c "$LOCK")
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

rm -rf "$WORK/dist" "$WORK/venv" "$WORK/outside"
"$PYTHON" -m venv "$WORK/venv"
PIP="$WORK/venv/bin/pip"
"$PIP" install --quiet --upgrade pip build
"$WORK/venv/bin/python" -m build --wheel --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
    || { tail -20 "$WORK/build.log"; echo "wheel-smoke: the wheel did not build (log: $WORK/build.log)"; exit 1; }
WHEEL="$(ls "$WORK"/dist/depthprobe-*.whl)"
echo "wheel-smoke: built $(basename "$WHEEL")"

# every file of the three folders (tracked, or new and not ignored) must be in the wheel, under depthprobe/
"$WORK/venv/bin/python" - "$ROOT" "$WHEEL" <<'PY'
import os, subprocess, sys, zipfile
root, wheel = sys.argv[1], sys.argv[2]
listed = ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "probes", "tasks", "cli"]
tracked = [f for f in subprocess.run(listed, capture_output=True, text=True, check=True).stdout.split()
           if os.path.isfile(os.path.join(root, f))]
inside = set(zipfile.ZipFile(wheel).namelist())
missing = [f for f in tracked if f"depthprobe/{f}" not in inside]
if missing:
    sys.exit("wheel-smoke: the wheel misses " + ", ".join(missing) + "; fix setup.py or package-data in pyproject.toml")
print(f"wheel-smoke: all {len(tracked)} files of probes/, tasks/, cli/ are in the wheel")
PY

"$PIP" install --quiet "${PIN[@]}" "$TORCH"
"$PIP" install --quiet "${PIN[@]}" "$WHEEL"
mkdir -p "$WORK/outside"
cd "$WORK/outside"   # nothing of the repository on the path from here on
BIN="$WORK/venv/bin"
"$BIN/python" - <<'PY'
import depthprobe.probes as probes
import depthprobe.probes.experiments.runner, depthprobe.probes.api.sweep, depthprobe.probes.api.viz  # noqa
from depthprobe.probes.experiments.protocol import EXPERIMENTS
assert all(EXPERIMENTS.get(f).name == f for f in ("levine", "petty", "spa", "khop", "groups"))  # every family module
assert "site-packages" in probes.__path__[0], probes.__path__
print("wheel-smoke: import ok from", probes.__path__[0], "-", len(probes.task_names()), "tasks")
PY
"$BIN/probe" list tasks > /dev/null
for cmd in "" run train study sweep viz report compare list; do
    "$BIN/probe" $cmd --help > /dev/null || { echo "wheel-smoke: probe $cmd --help failed"; exit 1; }
done
"$BIN/probe" run --task attention-stats --limit 5 --out "$WORK/outside/run" > "$WORK/run.log"
test -s "$WORK/outside/run/scores.csv" && test -s "$WORK/outside/run/report.html"
echo "wheel-smoke: probe list, every --help and probe run --task attention-stats --limit 5 work from the installed wheel"
