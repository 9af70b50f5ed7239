#!/usr/bin/env bash
# The test command (README, .ci/run): set up .venv/ (tools/setup_env.sh: fast once done) and run the
# whole test suite on CPU. Extra arguments go to pytest, e.g. `bash tools/run_tests.sh -k registry -x`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh

PY="${VENV:-$ROOT/.venv}/bin/python"
status=0
"$PY" -m pytest tests -q -ra --durations=15 "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "[run_tests] ERROR: pytest collected no tests (exit 5): check the arguments and tests/." >&2
fi
exit "$status"
