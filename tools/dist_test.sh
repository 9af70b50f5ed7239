#!/usr/bin/env bash
# Distributed testing with torchrun: one process per GPU (per CPU worker without CUDA: tools/test.py
# then uses the gloo backend).
#
#   bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py arguments ...]
#
# Multi-node: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500) from the environment.
# Python: $PYTHON, else the checkout's .venv/bin/python, else python.
set -euo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py arguments ...]" >&2; exit 2
fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
if ! [[ "$GPUS" =~ ^[1-9][0-9]*$ ]]; then
    echo "dist_test.sh: GPUS must be a positive integer (processes per node), got '$GPUS'" >&2; exit 2
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
    "$ROOT/tools/test.py" \
    "$CONFIG" \
    "$CHECKPOINT" \
    --launcher pytorch "$@"
