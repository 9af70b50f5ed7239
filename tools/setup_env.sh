#!/usr/bin/env bash
# Build .venv/ in the repository with the pinned OpenMMLab 2.0 stack (requirements.txt) and mmppma
# installed in editable mode. Idempotent: a finished environment is detected by a stamp that records the
# hash of requirements.txt and setup.py; re-running after either changes updates the environment.
# The mmcv build (~20 min on 2 cores) happens once per machine: pip caches the built wheel.
#
# Environment: PYTHON (interpreter to create the venv with, default python3), VENV (default .venv),
# MAX_JOBS (parallel compile jobs for mmcv, default: number of cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.mmppma-env-stamp"
REQ="$ROOT/requirements.txt"

log() { printf '[setup_env %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() {
    printf '[setup_env] ERROR: %s\n' "$*" >&2
    exit 1
}
trap 'fail "step failed at line $LINENO (see the output above). Fix the cause and re-run: bash tools/setup_env.sh"' ERR

want="$(cat "$REQ" setup.py | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    log "environment $VENV is up to date"
    exit 0
fi

command -v "$PYTHON" >/dev/null || fail "no '$PYTHON' on PATH; set PYTHON=/path/to/python3 (3.9-3.12)"
"$PYTHON" -c 'import sys; assert (3, 9) <= sys.version_info[:2] <= (3, 12)' \
    || fail "$PYTHON is $("$PYTHON" --version 2>&1); mmcv 2.1.0 supports Python 3.9-3.12"

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV" || fail "python -m venv failed; install the venv module (Debian: apt-get install python3-venv)"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# requirement line for a package, as pinned in requirements.txt
pin() { grep -E "^$1([=<>! ]|$)" "$REQ" | head -n1; }

log "step 1/4: build tools ($(pin setuptools), wheel, ninja)"
"${PIP[@]}" install "$(pin setuptools)" "$(pin wheel)" "$(pin ninja)"

log "step 2/4: torch, numpy, mmengine ($(pin torch))"
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] else 1)' 2>/dev/null \
    && [[ -n "${MMPPMA_KEEP_TORCH:-}" ]]; then
    log "MMPPMA_KEEP_TORCH set: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    "${PIP[@]}" install "$(pin torch)"
fi
"${PIP[@]}" install "$(pin numpy)" "$(pin mmengine)"

log "step 3/4: $(pin mmcv) with compiled ops (first time on a machine: ~20 min on 2 cores; cached afterwards)"
if "$PY" -c 'import mmcv, sys; from mmcv.ops import nms; sys.exit(0 if mmcv.__version__ == "2.1.0" else 1)' 2>/dev/null; then
    log "mmcv 2.1.0 with ops already present"
else
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "${PIP[@]}" install --no-build-isolation --progress-bar off -v "$(pin mmcv)" 2>&1 \
        | grep --line-buffered -E 'Building wheel|Created wheel|Successfully|Using cached|ERROR|error:|\[[0-9]+/[0-9]+\]' \
        | sed -u -E 's/^ *(\[[0-9]+\/[0-9]+\]) .*-c ([^ ]+\/)?([^/ ]+\.(cpp|cu)) .*/  \1 compiling \3/' \
        || true
    "$PY" -c 'from mmcv.ops import nms, RoIAlign' \
        || fail "mmcv's compiled ops do not import. Re-run with the full log: MMCV_WITH_OPS=1 $PY -m pip install --no-build-isolation -v $(pin mmcv)"
fi

log "step 4/4: downstream libraries, triton, test tools, and mmppma (editable)"
mapfile -t rest < <(grep -vE '^\s*(#|$)' "$REQ" | grep -vE '^(setuptools|wheel|ninja|torch|numpy|mmengine|mmcv)([=<>! ]|$)')
"${PIP[@]}" install "${rest[@]}"
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"

log "checking the stack imports"
"$PY" - <<'PYEOF'
import importlib
for name in ['torch', 'mmengine', 'mmcv', 'mmpretrain', 'mmdet', 'mmseg', 'triton', 'mmppma']:
    mod = importlib.import_module(name)
    print(f'  {name:<12} {getattr(mod, "__version__", "?")}')
from mmcv.ops import nms  # noqa: F401  (compiled ops)
PYEOF
echo "$want" > "$STAMP"
log "done: $VENV is ready (activate with: source $VENV/bin/activate)"
