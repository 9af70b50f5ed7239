"""Shared test setup: thread count, RNG seeds, the tiers, the release key lists in ``tests/fixtures`` (and state
dicts made from them), tools/ scripts as modules, and running Python or a tool in a fresh process."""
import atexit
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = REPO_ROOT / 'tools'
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

# CI has 2 cores; more threads only add overhead for tiny tensors. Under pytest-xdist the workers share the cores.
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
    shapes = {}
    for line in (FIXTURES / f'official_{name}_keys.txt').read_text().splitlines():
        key, shape = line.split(' ', 1)
        shapes[key] = tuple(int(s) for s in shape.strip('()').split(',') if s.strip())
    return shapes


def random_tensors(shapes: Mapping[str, Tuple[int, ...]], scale: float = 1.0) -> Dict[str, torch.Tensor]:
    """Tensors of ``shapes`` ~ N(0, scale^2) (seed 0); running variances U(0.5, 1.5), ``num_batches_tracked`` 7."""
    gen, state = torch.Generator().manual_seed(0), {}
    for key, shape in shapes.items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(7)
        elif key.endswith('running_var'):
            state[key] = torch.rand(shape, generator=gen) + 0.5
        else:
            state[key] = torch.randn(shape, generator=gen) * scale
    return state


def release_state(name: str, random: bool = False) -> Dict[str, torch.Tensor]:
    """A release state dict with the keys and shapes of ``fixture_shapes(name)``: uninitialized tensors, or with
    ``random`` :func:`random_tensors`; ``num_batches_tracked`` 7."""
    shapes = fixture_shapes(name)
    if random:
        return random_tensors(shapes)
    return {k: torch.tensor(7) if k.endswith('num_batches_tracked') else torch.empty(s) for k, s in shapes.items()}


@pytest.fixture(scope='session')
def repo_root() -> Path:
    return REPO_ROOT


#: whether the running test emptied the ops' caches (:func:`forget_preflight`)
_FORGOT = []


def forget_preflight() -> None:
    """Forget what the ops learnt - the Triton paths' preflight verdicts, the launch plans built on them, the
    kernels' launch parameters (:func:`mmppma.ops.clear_caches`) - for the rest of the test; what the test makes them
    learn (under its patches) is forgotten again when it ends."""
    from mmppma.ops import clear_caches
    clear_caches()
    _FORGOT.append(True)


@pytest.fixture(autouse=True)
def _forget_after():
    yield
    if _FORGOT:
        _FORGOT.clear()
        from mmppma.ops import clear_caches
        clear_caches()


@functools.lru_cache(maxsize=None)
def load_tool(path: str):
    """``tools/<path>`` imported as a module (tools/ is not a package), e.g. ``load_tool('train.py')``."""
    spec = importlib.util.spec_from_file_location(f'mmppma_tools_{Path(path).stem}', TOOLS / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def converter_main():
    """``main(argv)`` of tools/model_converters/release_to_mmppma.py."""
    return load_tool('model_converters/release_to_mmppma.py').main


def subprocess_env(extra_pythonpath: Sequence[str] = (), **env: str) -> Dict[str, str]:
    """The current environment plus ``extra_pythonpath`` and ``env``; single-threaded, quiet."""
    merged = dict(os.environ)
    paths = [str(p) for p in extra_pythonpath] + [merged.get('PYTHONPATH', '')]
    merged['PYTHONPATH'] = os.pathsep.join(p for p in paths if p)
    merged.setdefault('OMP_NUM_THREADS', '1')
    merged.update(env)
    return merged


def run(args: Sequence, env: Mapping[str, str], check: bool = True, cwd: Optional[Path] = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` (the interpreter running the tests; ``bash`` for a .sh script) in a fresh process; with
    ``check`` a non-zero exit fails the test, showing the tail of the output."""
    args = [str(a) for a in args]
    cmd = (['bash'] if args[0].endswith('.sh') else [sys.executable]) + args
    proc = subprocess.run(cmd, cwd=str(cwd or REPO_ROOT), env=dict(env), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f'`{" ".join(cmd)}` exited with {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-4000:]}'
                    f'\n--- stderr (tail) ---\n{proc.stderr[-5000:]}')
    return proc


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """``run_python(args, check=True, cwd=None, timeout=300, extra_pythonpath=(), **env)``: :func:`run` in
    :func:`subprocess_env`."""
    return lambda args, check=True, cwd=None, timeout=300, extra_pythonpath=(), **env: run(
        args, subprocess_env(extra_pythonpath, **env), check, cwd, timeout)
