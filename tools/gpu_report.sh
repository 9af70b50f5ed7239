#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one run, each step's output also written to DIR:
#   card.txt             the GPU, driver, torch and triton
#   gpu_check.log/.json  python tools/gpu_check.py --quick (every op and dtype against float64, then speed)
#   benchmark_model.log  PPMA-T and RMT-T classification trunks, 224 x 224, batch 64, bf16 inference
#                        (impl auto and torch; with RELEASE_DIR also the release's models from that folder)
#   bash tools/gpu_report.sh DIR     # PYTHON (default python3), GPU_CHECK_SECONDS (240), BENCHMARK_SECONDS (400)
# The classification benchmark reads configs/*_in1k.py, whose bases are mmpretrain's: install mmpretrain (not mmcv).
set -uo pipefail
OUTDIR="${1:?usage: bash tools/gpu_report.sh DIR}"
PY="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
status=0
CARD='import sys, torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "python", '\
'sys.version.split()[0], torch.cuda.get_device_name(), torch.cuda.get_device_capability())'
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$PY" -c "$CARD"
} 2>&1 | tee "$OUTDIR/card.txt" || status=1
echo "== python tools/gpu_check.py --quick"
timeout "${GPU_CHECK_SECONDS:-240}" "$PY" tools/gpu_check.py --quick --json "$OUTDIR/gpu_check.json" 2>&1 \
    | tee "$OUTDIR/gpu_check.log" || status=1
BENCH=(tools/benchmark_model.py --device cuda --task classifier --mode infer --shape 224 224 --batch 64 --amp bf16
       --models PPMA RMT --impl auto torch --iters 20 --rounds 2)
if [[ -n "${RELEASE_DIR:-}" ]]; then
    BENCH+=(--release-dir "$RELEASE_DIR")
fi
echo "== python ${BENCH[*]}"
timeout "${BENCHMARK_SECONDS:-400}" "$PY" "${BENCH[@]}" 2>&1 | tee "$OUTDIR/benchmark_model.log" || status=1
exit $status
