"""setup.py's torch and triton floors are at least the newest version introducing a feature the code needs (the
table), and the installed versions have them all."""
import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

SETUP = Path(__file__).resolve().parent.parent / 'setup.py'


# (package, version that introduced it, feature and where the code uses it, check on the installed version);
# the versions are the first releases documenting the feature (PyTorch docs, triton's merged pull requests)
FEATURES = [
    ('torch', (2, 4), 'torch.library.custom_op: the mmppma:: ops, registered at import',
     lambda: callable(torch.library.custom_op)),
    ('torch', (2, 4), 'CustomOpDef.register_fake / register_autograd, called at import',
     lambda: all(hasattr(torch._library.custom_ops.CustomOpDef, name)
                 for name in ('register_fake', 'register_autograd'))),
    ('torch', (2, 3), 'torch.compiler.is_compiling: the ops and layers pick their path by it',
     lambda: torch.compiler.is_compiling() is False),
    ('torch', (2, 7), 'torch.compiler.is_exporting: every op asks it (mmppma.ops.export.exporting)',
     lambda: torch.compiler.is_exporting() is False),
    ('triton', (3, 0), "tl.dot(..., input_precision=): every kernel's products",
     lambda: 'input_precision' in inspect.signature(importlib.import_module('triton.language').dot).parameters),
    ('triton', (3, 0), 'the maxnreg launch option (mmppma.ops.triton_support.launch.Config)',
     lambda: 'maxnreg' in {f.name for f in dataclasses.fields(
         importlib.import_module('triton.backends.nvidia.compiler').CUDAOptions)}),
    ('triton', (3, 0), "triton.runtime.errors.TritonError: impl='auto' falls back on it",
     lambda: issubclass(*(getattr(importlib.import_module('triton.runtime.errors'), name)
                          for name in ('OutOfResources', 'TritonError')))),
]


def _floors():
    """{'torch': (2, 7), ...} from setup.py's RANGES, read without running setup()."""
    for node in ast.walk(ast.parse(SETUP.read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], 'id', None) == 'RANGES':
            ranges = ast.literal_eval(node.value)
    return {name: tuple(int(part) for part in re.search(r'>=([\d.]+)', spec).group(1).split('.'))
            for name, spec in ranges.items() if '>=' in spec}


@pytest.mark.parametrize('package', ['torch', 'triton'])
def test_setup_floor_is_the_newest_feature_version(package):
    newest = max(version for name, version, _, _ in FEATURES if name == package)
    assert _floors()[package] >= newest, f'setup.py asks for {package}>={_floors()[package]}; the code needs {newest}'


@pytest.mark.parametrize('package, version, feature, check', FEATURES, ids=[row[2].split(':')[0] for row in FEATURES])
def test_installed_version_has_the_feature(package, version, feature, check):
    pytest.importorskip(package, reason='triton is part of the pinned stack (requirements.txt); install it')
    assert check(), f'{package} lacks {feature} (introduced in {".".join(map(str, version))})'
