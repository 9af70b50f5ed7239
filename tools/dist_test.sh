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
source "$(dirname "${BASH_SOURCE[0]}")/dist_launch.sh"
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
dist_launch dist_test.sh test.py "$GPUS" "$CONFIG" "$CHECKPOINT" "$@"
