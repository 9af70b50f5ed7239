#!/usr/bin/env bash
# A smoke run (README): set up .venv/ (tools/setup_env.sh: fast once done), then a PPMA smoke run on
# CPU: build dict(type='mmppma.PPMA', arch='tiny', out_indices=(0, 1, 2, 3)) through mmengine's MODELS
# registry, forward + backward a random 2x3x224x224 batch, print output shapes, parameters and timings.
# Extra arguments go to tools/demo.py, e.g. `bash tools/demo.sh --arch small --size 256`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
exec "${VENV:-$ROOT/.venv}/bin/python" tools/demo.py "$@"
