#!/usr/bin/env bash
# The GPU figures of docs/gpu_runs.md in two parts of at most 9 minutes each, one call of the GPU machine each (part 1
# first: a machine lent for 15 minutes fits a start and part 1). Each step runs under its own timeout (their sum is
# at most BUDGET_SECONDS) and writes its output to DIR; a summary of every step ends the run (summary.txt), also when
# a step fails or runs out of time. Each benchmark_model run is its own process: on an H200 machine one run took 20
# to 45 s (process start, imports, the kernels' first compile), which the timeouts allow for. The steps, in order:
# part 1
#   card.txt             the GPU, driver, torch and triton
#   gpu_check.log/.json  python tools/gpu_check.py --quick: every op and dtype against float64, outputs and the
#                        gradients, then speed at the configs' 64 images
#   cls_infer_b64.log    the classification trunks (configs/*_8xb128_in1k.py), 224 x 224, batch 64, bf16 inference:
#                        PPMA-T and RMT-T with impl auto and torch, and with --release-dir the release's PPMA-T and RMT-T
#   cls_train_b64.log    the same trunks' training step (forward, backward, AdamW), impl auto
# part 2
#   ops_800x1344.log     python tools/gpu_check.py at Mask R-CNN's 800 x 1344 (PPMA-T, RMT-T; bf16; speed at 2 images)
#   linear_train_b64.log PPMLA-T against MLLA-T, the training step of cls_train_b64
#   backbone_800x1344.log  the backbones alone at 800 x 1344, batch 2, a training step: PPMA-T vs RMT-T (no mmcv)
#   release_train_b64.log  cls_train_b64 with --release-dir: ours and the release's in one run
#
#   bash tools/gpu_report.sh DIR [--part 1|2] [--release-dir RELEASE]   # RELEASE: the release's PPMA.py and RMT.py;
#                                                                       # PYTHON (default python3) runs the tools
# On a machine with only torch and triton the classification steps need mmengine and mmpretrain (not mmcv): the
# script prints the pip line for them first.
set -uo pipefail
usage='usage: bash tools/gpu_report.sh DIR [--part 1|2] [--release-dir RELEASE]'
OUTDIR=""
PART=1
RELEASE_DIR=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --release-dir) RELEASE_DIR="${2:?--release-dir needs a folder: the release PPMA.py and RMT.py}"
                       shift 2 ;;
        --part) PART="${2:-}"
                if [[ "$PART" != 1 && "$PART" != 2 ]]; then
                    echo "gpu_report.sh: --part takes 1 or 2, not '${PART}'; $usage" >&2; exit 2
                fi
                shift 2 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "gpu_report.sh: unknown option '$1'; $usage" >&2; exit 2 ;;
        *) if [[ -n "$OUTDIR" ]]; then echo "gpu_report.sh: one DIR only; $usage" >&2; exit 2; fi
           OUTDIR="$1"; shift ;;
    esac
done
if [[ -z "$OUTDIR" ]]; then echo "$usage" >&2; exit 2; fi
PY="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
BUDGET_SECONDS=540

CARD='import sys, torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "python", '\
'sys.version.split()[0], torch.cuda.get_device_name(), torch.cuda.get_device_capability())'
CLS=(tools/benchmark_model.py --device cuda --task classifier --shape 224 224 --amp bf16 --batch 64 --iters 20)
RELEASE=()
if [[ -n "$RELEASE_DIR" ]]; then
    RELEASE=(--release-dir "$RELEASE_DIR")
fi
BACKBONE=(tools/benchmark_model.py --device cuda --task backbone --shape 800 1344 --batch 2 --mode train --amp bf16
          --models PPMA RMT --impl auto --no-stages --iters 5)
# the steps of each part in the order they run, and each one's timeout in seconds
PARTS=("card gpu_check cls_infer_b64 cls_train_b64" "ops_800x1344 linear_train_b64 backbone_800x1344 release_train_b64")
read -r -a NAMES <<< "${PARTS[$((PART - 1))]}"
declare -A SECONDS_OF=([card]=10 [gpu_check]=240 [cls_infer_b64]=150 [cls_train_b64]=130
                       [ops_800x1344]=70 [linear_train_b64]=110 [backbone_800x1344]=100 [release_train_b64]=200)
total=0
for name in "${NAMES[@]}"; do total=$((total + SECONDS_OF[$name])); done
if (( total > BUDGET_SECONDS )); then
    echo "gpu_report.sh: the steps' timeouts sum to ${total} s, over the budget of ${BUDGET_SECONDS} s" >&2
    exit 2
fi

run_step() {  # run_step NAME COMMAND...: under the step's timeout, output to DIR/NAME.log (card: card.txt); only
              # the steps of the part asked for
    local name="$1"; shift
    [[ " ${NAMES[*]} " == *" $name "* ]] || return 0
    local seconds="${SECONDS_OF[$name]}" log="$OUTDIR/$name.log" start rc
    [[ "$name" == card ]] && log="$OUTDIR/card.txt"
    echo "== $name (timeout ${seconds} s): $*"
    start=$(date +%s)
    timeout "$seconds" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local took=$(( $(date +%s) - start ))
    if [[ $rc -eq 0 ]]; then
        RESULTS+=("$(printf '%-18s ok         %4d s' "$name" "$took")")
    elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
        RESULTS+=("$(printf '%-18s TIMED OUT  %4d s (limit %d s; the rows printed before it are in %s)' \
                          "$name" "$took" "$seconds" "$log" )")
        status=1
    else
        RESULTS+=("$(printf '%-18s FAILED     %4d s (exit %d; see %s)' "$name" "$took" "$rc" "$log")")
        status=1
    fi
}

status=0
RESULTS=()
PIP_LINE="pip install $(grep -E '^(mmengine|mmpretrain)==' requirements.txt | tr '\n' ' ' | sed 's/ $//')"
echo "The classification steps need mmengine and mmpretrain (not mmcv); on a machine with only torch and triton:"
echo "    $PIP_LINE"
if ! "$PY" -c 'import mmengine, mmpretrain' >/dev/null 2>&1; then
    echo "mmengine or mmpretrain is missing here: the classification steps will fail until: $PIP_LINE"
fi
run_step card bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; "$0" -c "$1"' \
    "$PY" "$CARD"
run_step gpu_check "$PY" tools/gpu_check.py --quick --json "$OUTDIR/gpu_check.json"
run_step cls_infer_b64 "$PY" "${CLS[@]}" --mode infer --models PPMA RMT --impl auto torch "${RELEASE[@]}"
run_step cls_train_b64 "$PY" "${CLS[@]}" --mode train --optimizer --models PPMA RMT --impl auto
run_step ops_800x1344 "$PY" tools/gpu_check.py --shapes det_800x1344 --models ppma_t rmt_t --dtype bf16 \
    --speed-batch 2 --repeats 10 --json "$OUTDIR/ops_800x1344.json"
run_step linear_train_b64 "$PY" "${CLS[@]}" --mode train --optimizer --models PPMLA MLLA --impl auto
run_step backbone_800x1344 "$PY" "${BACKBONE[@]}"
run_step release_train_b64 "$PY" "${CLS[@]}" --mode train --optimizer --models PPMA RMT --impl auto "${RELEASE[@]}"

{
    echo "== summary, part ${PART} (step timeouts sum to ${total} s of ${BUDGET_SECONDS} s)"
    printf '%s\n' "${RESULTS[@]}"
} | tee "$OUTDIR/summary.txt"
exit $status
