#!/usr/bin/env bash
# Training on a Slurm cluster: srun starts one task per GPU, tools/train.py reads the rank from Slurm.
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#       bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py arguments ...]
#
# Python: $PYTHON, else the checkout's .venv/bin/python, else python. Needs CUDA (mmengine's Slurm init).
set -euo pipefail

if [[ $# -lt 4 ]]; then
    echo "usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py arguments ...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python; fi
fi

# SRUN_ARGS is split on purpose (several srun options in one variable)
# shellcheck disable=SC2086
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher slurm "$@"
