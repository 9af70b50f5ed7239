#!/usr/bin/env bash
# The test command (README, .ci/run): set up .venv/ (tools/setup_env.sh: fast once done) and run the test
# suite on CPU, over MMPPMA_TEST_WORKERS pytest-xdist processes (default 2; 0 runs in this process).
#   bash tools/run_tests.sh          the default tier (CI): every module and tool, within 10 minutes on 2 cores
#   bash tools/run_tests.sh --all    the full tier: also the tests marked heavy (cold torch.compile of whole models)
#   bash tools/run_tests.sh --cov    with line coverage of mmppma/ (pytest-cov; a report in the terminal)
# Other arguments go to pytest, e.g. `bash tools/run_tests.sh -k registry -x`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh

PY="${VENV:-$ROOT/.venv}/bin/python"
ARGS=()
for arg in "$@"; do
    if [[ "$arg" == --cov ]]; then
        ARGS+=(--cov=mmppma --cov-report=term)
    else
        ARGS+=("$arg")  # --all is pytest's own option (tests/conftest.py)
    fi
done
WORKERS="${MMPPMA_TEST_WORKERS:-2}"
PARALLEL=()
if [[ "$WORKERS" != 0 ]]; then
    # one test at a time per worker, the slow tests first (tests/conftest.py): the long torch.compile runs start
    # at once on different workers while the other worker goes through the short tests
    PARALLEL=(-n "$WORKERS" --dist load --maxschedchunk 1)
fi
status=0
"$PY" -m pytest tests -q -ra --durations=15 "${PARALLEL[@]}" ${ARGS[@]+"${ARGS[@]}"} || status=$?
if [[ $status -eq 5 ]]; then
    echo "[run_tests] ERROR: pytest collected no tests (exit 5): check the arguments and tests/." >&2
fi
exit "$status"
