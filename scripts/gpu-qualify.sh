#!/usr/bin/env bash
# First contact with a GPU host: install amp-harness without touching the host's torch, calibrate
# the GPU's hardware class, run every suite on cuda:0 and the CPU, write candidate baselines, and
# pack baselines, run report, JUnit XML and log into one archive. Budget: 8 minutes on one H200.
#
#   scripts/gpu-qualify.sh [OUT_DIR]                 # on a GPU host (CUDA torch, pytest, hypothesis,
#                                                    # pytest-benchmark, pytest-xdist, pandas, pyarrow
#                                                    # installed)
#   AMP_DEVICE=cpu scripts/gpu-qualify.sh /tmp/dry   # dry run on a CPU machine: same flow, device cpu
#
# Environment: AMP_DEVICE (default cuda:0), CALIBRATION_RUNS (default 5), CALIBRATION_CASES (default:
# every default-tier case, e.g. "matmul_1024/bfloat16"), PYTEST_ARGS (extra pytest arguments, e.g. a
# narrower selection), SKIP_INSTALL=1 (the project is installed already).
# A test that crashes its process or hangs is CRASHED / HUNG and the run goes on (--amp-isolate).
# Exit status: the qualification verdict's (0 qualified, 1 a capability failed, crashed or hung, 2
# noisy / not judged / did not run); on the first run on a new GPU, missing CUDA baselines fail by design:
# the archive holds them as candidates (review, then commit them).
set -uo pipefail
case "${1:-}" in
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
esac
cd "$(dirname "$0")/.."

OUT="${1:-gpu-qualify-out}"
DEVICE="${AMP_DEVICE:-cuda:0}"
RUNS="${CALIBRATION_RUNS:-5}"
START=$(date +%s)
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu-qualify.log"
: > "$LOG"

step() { echo "[gpu-qualify +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
run() { step "\$ $*"; "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

step "output directory: $OUT (device $DEVICE)"
run python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    # --no-deps: the host's torch (and everything else it has) stays as it is. The host's own
    # setuptools builds it first (GPU hosts are often offline); an isolated build is the fallback.
    run python -m pip install --quiet --no-deps --no-build-isolation -e . \
        || run python -m pip install --quiet --no-deps -e . || { step "install failed"; exit 1; }
fi
python -c "import harness" 2>/dev/null || { step "amp-harness is not importable"; exit 1; }

step "candidate baselines start as a copy of the repository's"
rm -rf "$OUT/baselines"
cp -r baselines "$OUT/baselines"

run amp-harness profile --baseline-dir "$OUT/baselines"
run amp-harness profile --json > "$OUT/fingerprint.json"

step "calibrating the speed thresholds of this device's hardware class, eager and compiled AMP ($RUNS runs per case)"
CASES=()
[ -n "${CALIBRATION_CASES:-}" ] && read -r -a CASES <<< "--cases ${CALIBRATION_CASES}"
run amp-harness calibrate --device "$DEVICE" --runs "$RUNS" --baseline-dir "$OUT/baselines" --compiled "${CASES[@]}"
if [ -z "${CALIBRATION_CASES:-}" ]; then
    step "calibrating fp8 scaled matmul against bf16 matmul (the fp8 suite's speed case)"
    run amp-harness calibrate --device "$DEVICE" --runs "$RUNS" --baseline-dir "$OUT/baselines" \
        --cases scaled_mm_e4m3/float8_e4m3fn
fi
python -c "import torchao" 2>/dev/null \
    || step "torchao is not installed: the fp8 suite's torchao checks will skip (pip install 'amp-harness[fp8]')"

DEVICES="$DEVICE"
[ "$DEVICE" != cpu ] && DEVICES=auto   # auto: the CPU and cuda:0
step "running every suite (--amp-device=$DEVICES); missing baselines are written as candidates"
# --amp-isolate: the tests run in a worker that is replaced when one crashes it (a segfault, an
# illegal memory access, an abort) or hangs in native code: CRASHED / HUNG, and the run goes on
# shellcheck disable=SC2086
run amp-harness qualify --report-dir "$OUT/reports" -- suites/ -p no:cacheprovider --amp-isolate \
    --amp-device="$DEVICES" --amp-baseline-dir="$OUT/baselines" --amp-regen ${PYTEST_ARGS:-}
VERDICT=$?

step "what the run changed against the repository's baselines"
diff -rq baselines "$OUT/baselines" 2>&1 | tee -a "$LOG" || true
find "$OUT/baselines" -name '*.obtained.json' | tee -a "$LOG"

ARCHIVE="$OUT/gpu-qualify-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ).tar.gz"
step "packing $ARCHIVE"
tar -czf "$ARCHIVE" -C "$OUT" baselines reports fingerprint.json gpu-qualify.log
step "done in $(( $(date +%s) - START ))s, verdict exit status $VERDICT; archive: $ARCHIVE"
exit "$VERDICT"
