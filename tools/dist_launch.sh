#!/usr/bin/env bash
# Shared by tools/dist_train.sh and tools/dist_test.sh (sourced): torchrun one process per GPU (per CPU worker
# without CUDA, where the launchers use the gloo backend).
#
#   dist_launch NAME SCRIPT GPUS [SCRIPT arguments ...]
#
# Multi-node: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500) from the environment.
# Python: $PYTHON, else the checkout's .venv/bin/python, else python.

dist_launch() {
    local name=$1 script=$2 gpus=$3
    shift 3
    if ! [[ "$gpus" =~ ^[1-9][0-9]*$ ]]; then
        echo "$name: GPUS must be a positive integer (processes per node), got '$gpus'" >&2; exit 2
    fi
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local python="${PYTHON:-}"
    if [[ -z "$python" ]]; then
        if [[ -x "$root/.venv/bin/python" ]]; then python="$root/.venv/bin/python"; else python=python; fi
    fi
    PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
    exec "$python" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" \
        --node_rank="${NODE_RANK:-0}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --nproc_per_node="$gpus" \
        --master_port="${PORT:-29500}" \
        "$root/tools/$script" \
        "$@" \
        --launcher pytorch
}
