#!/usr/bin/env bash
# The GPU check (README "GPU"): on a machine with CUDA, in about 5 minutes, one summary file.
#
#   scripts/gpu-check.sh [OUT]          (or: make gpu-check; OUT defaults to build/gpu-check)
#
# Steps (each under its own timeout; a step that fails is recorded and the check goes on):
#   1. bert:     a BERT-base-shaped model from a config (random weights, no download) and 2,000 lines
#   2. tasks:    induction, kernels, hop-attention (random native models) and attention-stats (bert)
#                on CUDA against CPU float32: scores within 1e-4 (float32), 5e-2 (bfloat16)
#   3. api:      run_with_cache with grad, patch, attribute on CUDA against CPU, within 1e-4
#   4. train:    probe train (400 steps) on CUDA
#   5. study-F:  probe study --family F --preset smoke --device cuda, for every family F
#   6. members:  steps/s of law members at the gpu preset's shapes, one by one and batched
#                (bench/bench_batched_members.py, khop and groups), and a small khop study with
#                --batch-members off against batches of 4 (bench/bench_batched_study.py)
#   7. process:  probe run --task attention-stats on the 2,000 lines against bench/bare_hf.py
#   8. cuda-tests: the tests marked cuda (batched members equal to one-by-one training on CUDA),
#                when pytest is installed
#
# Environment: PY (the Python with torch; default .venv/bin/python, else python3), PROBE (the probe
# command; default: next to PY), WHEELS (a folder of wheels installed first, offline: the packages
# a GPU image lacks; README "GPU" says how to build it), FAMILIES (default: the six study families).
# DEVICE=cpu rehearses every command on the CPU (for testing the script; SCALE=N multiplies every timeout).
# Without CUDA it prints one line and exits 0. Exit status: 0 when every step passed, 1 otherwise.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=$ROOT/.venv/bin/python; else PY=$(command -v python3); fi
fi
OUT=${1:-build/gpu-check}
FAMILIES=${FAMILIES:-levine petty spa khop groups crasp}
DEVICE=${DEVICE:-cuda}
SCALE=${SCALE:-1}

if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "gpu-check: $PY cannot import torch; set PY to a Python with torch installed" >&2
    exit 2
fi
if [ "$DEVICE" = cuda ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check"
    exit 0
fi

if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "$WHEELS"/*.whl || {
        echo "gpu-check: installing the wheels in WHEELS=$WHEELS failed" >&2
        exit 2
    }
fi
if ! "$PY" -c "import depthprobe.probes" 2>/dev/null; then
    "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . || exit 2
fi
PROBE=${PROBE:-$(dirname "$PY")/probe}
[ -x "$PROBE" ] || PROBE=$(command -v probe)

rm -rf "$OUT/logs" "$OUT/train" "$OUT"/study-* "$OUT/attention-stats"  # a rerun starts clean
mkdir -p "$OUT/logs"
SUMMARY=$OUT/summary.md
FAILS=0
START=$(date +%s)
declare -A SECS
{
    echo "# gpu-check $(date -u +%Y-%m-%dT%H:%MZ)"
    "$PY" -c 'import sys, torch
name = torch.cuda.get_device_name() if sys.argv[1] == "cuda" else "cpu"
print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")' "$DEVICE"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---|"
} >"$SUMMARY"

# step NAME TIMEOUT COMMAND...: run it, log its output, record status and seconds
step() {
    local name=$1 limit=$(($2 * SCALE))
    shift 2
    local t0 status
    t0=$(date +%s)
    timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    status=$?
    local secs=$(($(date +%s) - t0)) word=ok
    SECS[$name]=$secs
    if [ "$status" = 124 ]; then word="timed out ($limit s)"; elif [ "$status" != 0 ]; then word="FAILED ($status)"; fi
    [ "$word" = ok ] || FAILS=$((FAILS + 1))
    echo "| $name | $word | $secs |" >>"$SUMMARY"
    echo "gpu-check: $name: $word in $secs s" >&2
}

BERT=$OUT/bert-base
step bert 60 "$PY" scripts/gpu_check.py bert "$BERT"
step tasks 90 "$PY" scripts/gpu_check.py tasks --device "$DEVICE" --bert "$BERT"
step api 45 "$PY" scripts/gpu_check.py api --device "$DEVICE"
step train 60 "$PROBE" train --steps 400 --device "$DEVICE" --out "$OUT/train" --no-progress
for family in $FAMILIES; do
    step "study-$family" 60 "$PROBE" study --family "$family" --preset smoke --device "$DEVICE" --out "$OUT/study-$family"
done
step members-khop 60 "$PY" bench/bench_batched_members.py --device "$DEVICE" --family khop --depth 6 --width 128 \
    --length 100 --members 4 --steps 20 --rounds 2
step members-groups 60 "$PY" bench/bench_batched_members.py --device "$DEVICE" --family groups --group s5 --depth 6 \
    --width 128 --length 128 --members 4 --steps 20 --rounds 2
step members-study 120 "$PY" bench/bench_batched_study.py --device "$DEVICE" --depths 2,4 --width 128 --seeds 4 \
    --steps 200 --batch-members 4 --rounds 1
step process-probe 60 "$PROBE" run --model "$BERT" --task attention-stats --data "$BERT/lines.txt" --device "$DEVICE" \
    --out "$OUT/attention-stats"
step process-bare 60 "$PY" bench/bare_hf.py "$BERT" --batches "$BERT/batches.json"
if "$PY" -c "import pytest" 2>/dev/null; then
    step cuda-tests 90 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/training/test_batched.py
else
    echo "| cuda-tests | skipped: no pytest for $PY | 0 |" >>"$SUMMARY"
fi

TOTAL=$(($(date +%s) - START))
{
    echo
    echo "total: $TOTAL s ($([ "$TOTAL" -le 300 ] && echo within || echo OVER) the 5 minutes); failed steps: $FAILS"
    echo
    echo "## checks (PASS/FAIL lines)"
    grep -h -E "^(PASS|FAIL)" "$OUT/logs/tasks.log" "$OUT/logs/api.log" 2>/dev/null
    echo
    echo "## steps/s of law members (gpu preset shapes)"
    grep -h -E "members:|time:" "$OUT/logs/members-khop.log" "$OUT/logs/members-groups.log" 2>/dev/null
    echo
    echo "## a small khop study, batched members against one by one"
    grep -h -E "khop study:|training:|wall|identical" "$OUT/logs/members-study.log" 2>/dev/null
    echo
    echo "## whole process: BERT-base-shaped model, attention-stats on 2,000 lines, one round"
    echo "probe run ${SECS[process-probe]} s, bare Hugging Face script ${SECS[process-bare]} s (whole processes, imports and loading included; a step that timed out or failed says so in the table)"
} >>"$SUMMARY"
echo "gpu-check: summary in $SUMMARY ($FAILS failed steps)"
[ "$FAILS" = 0 ]
