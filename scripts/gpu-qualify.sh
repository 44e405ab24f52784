#!/usr/bin/env bash
# First contact with a GPU host: install amp-harness without touching the host's torch, calibrate
# the GPU's hardware class, run every suite on cuda:0 and the CPU, write candidate baselines, and
# pack baselines, run report, JUnit XML and log into one archive. Budget: 8 minutes on one H100 or
# H200 (BUDGET_S, default 480), leaving a 15-minute device window room for a rerun.
#
# Resume: a run cut short (by BUDGET_S, or by the device window ending) resumes when the same
# command runs again with the same OUT_DIR: finished stages are kept (install, calibration, the
# candidate baselines), a cut session's journal becomes a report, and the suites run only the tests
# that have no result yet (amp-harness qualify --resume); the verdict judges every part together.
#
#   scripts/gpu-qualify.sh [OUT_DIR]                 # on a GPU host (CUDA torch, pytest, hypothesis,
#                                                    # pytest-benchmark, pytest-xdist, pandas, pyarrow
#                                                    # installed)
#   AMP_DEVICE=cpu scripts/gpu-qualify.sh /tmp/dry   # dry run on a CPU machine: same flow, device cpu
#
# Environment: AMP_DEVICE (default cuda:0), CALIBRATION_RUNS (default 5), CALIBRATION_CASES (default:
# every default-tier case, e.g. "matmul_1024/bfloat16"), PYTEST_ARGS (extra pytest arguments, e.g. a
# narrower selection), SKIP_INSTALL=1 (the project is installed already), BUDGET_S (default 480),
# FRESH=1 (forget an earlier, cut run in OUT_DIR and start over).
# A test that crashes its process or hangs is CRASHED / HUNG and the run goes on (--amp-isolate).
# Exit status: the qualification verdict's (0 qualified, 1 a capability failed, crashed or hung, 2
# noisy / not judged / did not run), 3 cut at the budget (run the same command again to resume); on the first run on a new GPU, missing CUDA baselines fail by design:
# the archive holds them as candidates (review, then commit them).
set -uo pipefail
case "${1:-}" in
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
esac
cd "$(dirname "$0")/.."

OUT="${1:-gpu-qualify-out}"
DEVICE="${AMP_DEVICE:-cuda:0}"
RUNS="${CALIBRATION_RUNS:-5}"
BUDGET_S="${BUDGET_S:-480}"
# seconds kept back from the budget for what follows the suites: the baseline diff and the archive
ARCHIVE_S=30
START=$(date +%s)
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu-qualify.log"
STAGES="$OUT/.stages"
[ "${FRESH:-0}" = 1 ] && rm -rf "$STAGES" "$OUT/reports" "$OUT/baselines"
mkdir -p "$STAGES"
RESUMED="$(ls "$STAGES")"
[ -z "$RESUMED" ] && : > "$LOG"

step() { echo "[gpu-qualify +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
run() { step "\$ $*"; "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
done_before() { [ -f "$STAGES/$1" ] && step "stage $1: done in an earlier part, kept"; }
stage_done() { touch "$STAGES/$1"; }

step "output directory: $OUT (device $DEVICE, budget ${BUDGET_S}s)"
[ -n "$RESUMED" ] && step "resuming a run cut short: stages done before: $(echo "$RESUMED" | tr '\n' ' ')"
run python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
if [ "${SKIP_INSTALL:-0}" != 1 ] && ! done_before install; then
    # --no-deps: the host's torch (and everything else it has) stays as it is. The host's own
    # setuptools builds it first (GPU hosts are often offline); an isolated build is the fallback.
    run python -m pip install --quiet --no-deps --no-build-isolation -e . \
        || run python -m pip install --quiet --no-deps -e . || { step "install failed"; exit 1; }
    stage_done install
fi
python -c "import harness" 2>/dev/null || { step "amp-harness is not importable"; exit 1; }

if ! done_before baselines; then
    step "candidate baselines start as a copy of the repository's"
    rm -rf "$OUT/baselines"
    cp -r baselines "$OUT/baselines"
    stage_done baselines
fi

run amp-harness profile --baseline-dir "$OUT/baselines"
run amp-harness profile --json > "$OUT/fingerprint.json"

if ! done_before calibrate; then
    step "calibrating the speed thresholds of this device's hardware class, eager and compiled AMP ($RUNS runs per case)"
    CASES=()
    [ -n "${CALIBRATION_CASES:-}" ] && read -r -a CASES <<< "--cases ${CALIBRATION_CASES}"
    run amp-harness calibrate --device "$DEVICE" --runs "$RUNS" --baseline-dir "$OUT/baselines" --compiled "${CASES[@]}" \
        && stage_done calibrate
fi
if [ -z "${CALIBRATION_CASES:-}" ] && ! done_before calibrate-fp8; then
    step "calibrating fp8 scaled matmul against bf16 matmul (the fp8 suite's speed case)"
    run amp-harness calibrate --device "$DEVICE" --runs "$RUNS" --baseline-dir "$OUT/baselines" \
        --cases scaled_mm_e4m3/float8_e4m3fn && stage_done calibrate-fp8
fi
python -c "import torchao" 2>/dev/null \
    || step "torchao is not installed: the fp8 suite's torchao checks will skip (pip install 'amp-harness[fp8]')"

DEVICES="$DEVICE"
[ "$DEVICE" != cpu ] && DEVICES=auto   # auto: the CPU and cuda:0
LEFT=$(( BUDGET_S - ($(date +%s) - START) - ARCHIVE_S ))
if [ -f "$STAGES/suites" ]; then
    VERDICT="$(cat "$STAGES/suites")"
    step "stage suites: done in an earlier part (verdict exit status $VERDICT), kept"
elif [ "$LEFT" -le 0 ]; then
    step "the budget is spent before the suites: run the same command again to resume"
    VERDICT=3
else
    step "running every suite (--amp-device=$DEVICES, ${LEFT}s left); missing baselines are written as candidates"
    # --amp-isolate: the tests run in a worker that is replaced when one crashes it (a segfault, an
    # illegal memory access, an abort) or hangs in native code: CRASHED / HUNG, and the run goes on.
    # --resume: a cut earlier part's finished tests are not run again, and count in the verdict.
    # -n 1: one worker, replaced after a crash (the project's own `-n 2` is for its 2-core CPU machines).
    # shellcheck disable=SC2086
    run timeout --signal=TERM --kill-after=10 "$LEFT" amp-harness qualify --resume --report-dir "$OUT/reports" -- \
        suites/ -p no:cacheprovider --amp-isolate -n 1 --amp-device="$DEVICES" --amp-baseline-dir="$OUT/baselines" \
        --amp-regen ${PYTEST_ARGS:-}
    VERDICT=$?
    if [ "$VERDICT" -eq 124 ] || [ "$VERDICT" -eq 137 ]; then
        step "the suites were cut at the budget (${BUDGET_S}s): run the same command again to resume"
        VERDICT=3
    else
        echo "$VERDICT" > "$STAGES/suites"
    fi
fi

step "what the run changed against the repository's baselines"
diff -rq baselines "$OUT/baselines" 2>&1 | tee -a "$LOG" || true
find "$OUT/baselines" -name '*.obtained.json' | tee -a "$LOG"

ARCHIVE="$OUT/gpu-qualify-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ).tar.gz"
step "packing $ARCHIVE"
tar -czf "$ARCHIVE" -C "$OUT" baselines reports fingerprint.json gpu-qualify.log
step "done in $(( $(date +%s) - START ))s, verdict exit status $VERDICT; archive: $ARCHIVE"
exit "$VERDICT"
