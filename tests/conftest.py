"""Shared test setup: thread count, RNG seeds, the release key lists in ``tests/fixtures`` (and state dicts
made from them), the converter's ``main`` and a helper for running Python in a fresh subprocess."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / 'fixtures'

# torch.compile's caches in a folder of this run's own (inherited by the tools the tests start): a cache shared
# with other runs can hold a file another process was killed while writing
if 'TORCHINDUCTOR_CACHE_DIR' not in os.environ:
    os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(prefix='mmppma-inductor-')
    atexit.register(shutil.rmtree, os.environ['TORCHINDUCTOR_CACHE_DIR'], ignore_errors=True)

# Without a GPU the Triton kernel tests run on the interpreter, which must be chosen before triton is first
# imported (torch's compiler imports it while test modules are collected); with a GPU they run compiled.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

# CI has 2 cores; on a big machine more threads only add overhead for the tiny tensors used here. Under
# pytest-xdist (tools/run_tests.sh) the workers share the cores.
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 1))
torch.set_num_threads(int(os.environ.get('MMPPMA_TEST_THREADS',
                                         max(1, min(4, os.cpu_count() or 1) // _WORKERS))))


def pytest_addoption(parser) -> None:
    parser.addoption('--all', action='store_true', dest='full_tier',
                     help='the full tier: also the tests marked heavy (tools/run_tests.sh --all)')


def pytest_collection_modifyitems(config, items) -> None:
    """The default tier leaves out the ``heavy`` tests (``--all`` keeps them). Order for pytest-xdist handing out
    one test at a time with one more queued per worker (tools/run_tests.sh): the slow tests longest first
    (``slow(minutes=N)``), each followed by a fast one, so that two long runs never queue on one worker and none
    starts last; then the remaining fast tests. Each group keeps collection order."""
    if not config.getoption('full_tier'):
        heavy = [item for item in items if item.get_closest_marker('heavy')]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [item for item in items if not item.get_closest_marker('heavy')]
    slow = [item for item in items if item.get_closest_marker('slow')]
    fast = [item for item in items if not item.get_closest_marker('slow')]
    slow.sort(key=lambda item: -item.get_closest_marker('slow').kwargs.get('minutes', 0))
    ordered = []
    for i, item in enumerate(slow):
        ordered += [item] + fast[i:i + 1]
    items[:] = ordered + fast[len(slow):]


#: torch.compile backends for the compile tests: the default tier traces with aot_eager (dynamo and AOT autograd,
#: no code generation), the full tier also generates code with inductor
COMPILE_BACKENDS = [pytest.param('aot_eager', id='aot_eager'),
                    pytest.param('inductor', id='inductor', marks=[pytest.mark.heavy, pytest.mark.slow])]


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test starts from the same RNG state, so a failure reproduces when run alone."""
    torch.manual_seed(0)


def fixture_shapes(name: str) -> Dict[str, Tuple[int, ...]]:
    """Key -> shape of a release state dict, from ``tests/fixtures/official_<name>_keys.txt`` (one
    ``key (d0, d1, ...)`` per line, in state-dict order), e.g. ``fixture_shapes('ppma_T')``."""
    path = FIXTURES / f'official_{name}_keys.txt'
    shapes = {}
    for line in path.read_text().splitlines():
        key, shape = line.split(' ', 1)
        shapes[key] = tuple(int(s) for s in shape.strip('()').split(',') if s.strip())
    return shapes


def release_state(name: str, random: bool = False) -> Dict[str, torch.Tensor]:
    """A release state dict with the keys and shapes of ``fixture_shapes(name)``: uninitialized tensors, or with
    ``random`` normal ones (seed 0; running variances positive); ``num_batches_tracked`` 7."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in fixture_shapes(name).items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(7)
        elif not random:
            state[key] = torch.empty(shape)
        else:
            t = torch.randn(shape, generator=gen)
            state[key] = t.abs() + 0.1 if key.endswith('running_var') else t
    return state


@pytest.fixture(scope='session')
def repo_root() -> Path:
    return REPO_ROOT


CONVERTERS = REPO_ROOT / 'tools' / 'model_converters'


@pytest.fixture
def converter_main():
    """``main(argv)`` of tools/model_converters/release_to_mmppma.py, imported from its folder."""
    sys.path.insert(0, str(CONVERTERS))
    try:
        from release_to_mmppma import main
        yield main
    finally:
        sys.path.remove(str(CONVERTERS))


def subprocess_env(extra_pythonpath: Sequence[str] = (), **env: str) -> Dict[str, str]:
    """The current environment plus ``extra_pythonpath`` and ``env``; single-threaded, quiet."""
    merged = dict(os.environ)
    paths = [str(p) for p in extra_pythonpath] + [merged.get('PYTHONPATH', '')]
    merged['PYTHONPATH'] = os.pathsep.join(p for p in paths if p)
    merged.setdefault('OMP_NUM_THREADS', '1')
    merged.update(env)
    return merged


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """Run ``python ARGS`` (the interpreter running the tests) in a fresh process.

    Returns the CompletedProcess; with ``check=True`` (default) a non-zero exit fails the test and shows
    the tail of the output.
    """

    def run(args: Sequence[str],
            *,
            check: bool = True,
            cwd: Optional[Path] = None,
            timeout: float = 300,
            extra_pythonpath: Sequence[str] = (),
            **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *map(str, args)],
                              cwd=str(cwd or REPO_ROOT),
                              env=subprocess_env(extra_pythonpath, **env),
                              capture_output=True,
                              text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f'`python {" ".join(map(str, args))}` exited with {proc.returncode}\n'
                        f'--- stdout (tail) ---\n{proc.stdout[-4000:]}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}')
        return proc

    return run
