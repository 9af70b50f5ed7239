#!/usr/bin/env bash
# Distributed training with torchrun: one process per GPU (per CPU worker without CUDA: tools/train.py
# then uses the gloo backend).
#
#   bash tools/dist_train.sh CONFIG GPUS [tools/train.py arguments ...]
#
# Multi-node: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500) from the environment.
# Python: $PYTHON, else the checkout's .venv/bin/python, else python.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: bash tools/dist_train.sh CONFIG GPUS [tools/train.py arguments ...]" >&2; exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
if ! [[ "$GPUS" =~ ^[1-9][0-9]*$ ]]; then
    echo "dist_train.sh: GPUS must be a positive integer (processes per node), got '$GPUS'" >&2; exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "$@"
