#!/usr/bin/env bash
# The main job (README). Sets up .venv/ (tools/setup_env.sh: fast once done; skipped when $PYTHON is given),
# then: Mask R-CNN with a PPMA-T backbone, trained from scratch on CPU on the tiny COCO-style shapes set, then
# evaluated with mmdet's CocoMetric; prints bbox and segm mAP. About 10 minutes on 2 idle cores (docs/tiny_runs.md).
#
#   bash tools/tiny_coco_demo.sh [--iters N] [--work-dir DIR] [--data DIR] [--config CONFIG]
#
# Defaults: 300 iterations, work_dirs/tiny_coco_demo, data/tiny (made by tools/make_tiny_datasets.py; remade
# each run, identically), configs/tiny/mask_rcnn_ppma_t_tiny_coco.py. Python: $PYTHON, else .venv/bin/python.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ITERS=300
WORK_DIR="work_dirs/tiny_coco_demo"
DATA="data/tiny"
CONFIG="$ROOT/configs/tiny/mask_rcnn_ppma_t_tiny_coco.py"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --iters) ITERS="$2"; shift 2 ;;
        --work-dir) WORK_DIR="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        --config) CONFIG="$2"; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "tiny_coco_demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
if ! [[ "$ITERS" =~ ^[1-9][0-9]*$ ]]; then
    echo "tiny_coco_demo.sh: --iters needs a positive integer, got '$ITERS'" >&2; exit 2
fi
if [[ -z "${PYTHON:-}" ]]; then
    bash "$ROOT/tools/setup_env.sh"
fi
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
if [[ ! -x "$PYTHON" ]]; then
    echo "tiny_coco_demo.sh: no Python at $PYTHON; run 'bash tools/setup_env.sh' first or set PYTHON" >&2; exit 1
fi
mkdir -p "$DATA"
export MMPPMA_TINY_DATA="$(cd "$DATA" && pwd)"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
mkdir -p "$WORK_DIR"

echo "[tiny_coco_demo] 1/3 making the tiny COCO set in $MMPPMA_TINY_DATA"
"$PYTHON" "$ROOT/tools/make_tiny_datasets.py" --out "$MMPPMA_TINY_DATA" --tasks coco

echo "[tiny_coco_demo] 2/3 training $ITERS iterations on CPU (log: $WORK_DIR/train.log)"
start=$(date +%s)
# no periodic validation (mmengine's loop still validates once after the last iteration); tools/test.py then
# evaluates the saved checkpoint. The lr drops x0.1 at 80% of the run (the config computes its milestone from
# its own max_iters, so it is passed here).
"$PYTHON" "$ROOT/tools/train.py" "$CONFIG" --work-dir "$WORK_DIR" \
    --cfg-options train_cfg.max_iters="$ITERS" train_cfg.val_interval=$((ITERS + 1)) \
    param_scheduler.1.end="$ITERS" param_scheduler.1.milestones="[$((ITERS * 8 / 10))]" \
    default_hooks.checkpoint.interval="$ITERS" > "$WORK_DIR/train.log" 2>&1 \
    || { tail -n 40 "$WORK_DIR/train.log" >&2; echo "[tiny_coco_demo] training failed" >&2; exit 1; }
train_s=$(( $(date +%s) - start ))
grep -E "Iter\(train\) \[ *$ITERS/" "$WORK_DIR/train.log" | tail -n 1 || true

CKPT="$WORK_DIR/iter_${ITERS}.pth"
[[ -f "$CKPT" ]] || { echo "[tiny_coco_demo] no checkpoint at $CKPT" >&2; exit 1; }
echo "[tiny_coco_demo] 3/3 evaluating $CKPT (log: $WORK_DIR/test.log)"
"$PYTHON" "$ROOT/tools/test.py" "$CONFIG" "$CKPT" --work-dir "$WORK_DIR" > "$WORK_DIR/test.log" 2>&1 \
    || { tail -n 40 "$WORK_DIR/test.log" >&2; echo "[tiny_coco_demo] evaluation failed" >&2; exit 1; }

metrics=$(grep -oE "coco/(bbox|segm)_mAP(_50)?: [0-9.]+" "$WORK_DIR/test.log" | tail -n 4 | tr '\n' ' ')
[[ -n "$metrics" ]] || { tail -n 20 "$WORK_DIR/test.log" >&2; echo "[tiny_coco_demo] no mAP in the test log" >&2; exit 1; }
echo "[tiny_coco_demo] after $ITERS iterations (${train_s} s of training): $metrics"
