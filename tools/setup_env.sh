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

log "step 2/4: torch, torchvision, numpy, mmengine ($(pin torch), $(pin torchvision))"
if [[ -n "${MMPPMA_KEEP_TORCH:-}" ]] && "$PY" -c 'import torch, torchvision' 2>/dev/null; then
    log "MMPPMA_KEEP_TORCH set: keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    "${PIP[@]}" install "$(pin torch)" "$(pin torchvision)"
fi
"${PIP[@]}" install "$(pin numpy)" "$(pin mmengine)"

# mmcv's compiled ops are tied to the torch they were built against, and pip's own wheel cache does not
# key on that: build the wheel into a folder named after the torch version and install from there.
TORCH_TAG="$("$PY" -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")')"
WHEELHOUSE="${MMPPMA_WHEELHOUSE:-$HOME/.cache/mmppma/wheels}/$TORCH_TAG"
MMCV_PIN="$(pin mmcv)"
MMCV_VERSION="${MMCV_PIN#*==}"
log "step 3/4: $MMCV_PIN with compiled ops for $TORCH_TAG"
MMCV_BUILT_FOR="$VENV/.mmcv-built-for"
if [[ "$(cat "$MMCV_BUILT_FOR" 2>/dev/null)" == "$TORCH_TAG" ]] \
    && "$PY" -c "import mmcv, sys; from mmcv.ops import nms; sys.exit(0 if mmcv.__version__ == '$MMCV_VERSION' else 1)" 2>/dev/null; then
    log "mmcv $MMCV_VERSION with ops already installed"
else
    if ! ls "$WHEELHOUSE"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1; then
        log "building the mmcv wheel into $WHEELHOUSE (first time for this torch: ~20 min on 2 cores)"
        mkdir -p "$WHEELHOUSE"
        MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
            "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir --progress-bar off -v \
            -w "$WHEELHOUSE" "$MMCV_PIN" 2>&1 \
            | grep --line-buffered -E 'Building wheel|Created wheel|Successfully|ERROR|error:|\[[0-9]+/[0-9]+\]' \
            | sed -u -E 's/^ *(\[[0-9]+\/[0-9]+\]) .*-c ([^ ]+\/)?([^/ ]+\.(cpp|cu)) .*/  \1 compiling \3/' \
            || true
        ls "$WHEELHOUSE"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1 \
            || fail "building mmcv failed. Re-run with the full log: MMCV_WITH_OPS=1 $PY -m pip wheel --no-build-isolation --no-deps -v -w $WHEELHOUSE $MMCV_PIN"
    else
        log "using the cached wheel in $WHEELHOUSE"
    fi
    "${PIP[@]}" install --force-reinstall --no-deps "$WHEELHOUSE"/mmcv-"$MMCV_VERSION"-*.whl
    "${PIP[@]}" install "$WHEELHOUSE"/mmcv-"$MMCV_VERSION"-*.whl  # its dependencies
    "$PY" -c 'from mmcv.ops import nms, RoIAlign' \
        || fail "mmcv's compiled ops do not import; delete $WHEELHOUSE and re-run to rebuild them"
    echo "$TORCH_TAG" > "$MMCV_BUILT_FOR"
fi

log "step 4/4: timm, downstream libraries, triton, test tools, and mmppma (editable)"
mapfile -t rest < <(grep -vE '^\s*(#|$)' "$REQ" | grep -vE '^(setuptools|wheel|ninja|torch|torchvision|numpy|mmengine|mmcv)([=<>! ]|$)')
"${PIP[@]}" install "${rest[@]}"
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"

log "checking the stack imports"
"$PY" - <<'PYEOF'
import importlib
for name in ['torch', 'torchvision', 'mmengine', 'timm', 'mmcv', 'mmpretrain', 'mmdet', 'mmseg', 'triton', 'mmppma']:
    mod = importlib.import_module(name)
    print(f'  {name:<12} {getattr(mod, "__version__", "?")}')
from mmcv.ops import nms  # noqa: F401  (compiled ops)
import mmpretrain.models, mmdet.models, mmseg.models  # noqa: F401,E401  (their optional imports)
PYEOF
echo "$want" > "$STAMP"
log "done: $VENV is ready (activate with: source $VENV/bin/activate)"
