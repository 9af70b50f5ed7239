#!/usr/bin/env bash
# The test command (README, .ci/run): set up .venv/ (tools/setup_env.sh: fast once done) and run the
# whole test suite on CPU, over MMPPMA_TEST_WORKERS pytest-xdist processes (default 2; 0 runs in this process).
# Extra arguments go to pytest, e.g. `bash tools/run_tests.sh -k registry -x`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh

PY="${VENV:-$ROOT/.venv}/bin/python"
WORKERS="${MMPPMA_TEST_WORKERS:-2}"
PARALLEL=()
if [[ "$WORKERS" != 0 ]]; then
    # one test at a time per worker, the slow tests first (tests/conftest.py): the long torch.compile runs start
    # at once on different workers while the other worker goes through the short tests
    PARALLEL=(-n "$WORKERS" --dist load --maxschedchunk 1)
fi
status=0
"$PY" -m pytest tests -q -ra --durations=15 "${PARALLEL[@]}" "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "[run_tests] ERROR: pytest collected no tests (exit 5): check the arguments and tests/." >&2
fi
exit "$status"
