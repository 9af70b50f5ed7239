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
source "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh"
CONFIG=$1
GPUS=$2
shift 2
dist_launch dist_train.sh train.py "$GPUS" "$CONFIG" "$@"
