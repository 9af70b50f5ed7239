"""The README's pip route in a fresh venv (full tier): `pip install mmcv-lite==2.1.0 -e .[cls]` over torch (linked
from this interpreter) and setuptools >= 81; every classification config loads and PPMA-T's classifier runs."""
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Iterable, List

import pytest
from packaging.requirements import Requirement

from .conftest import REPO

NOT_SHARED = {'setuptools', 'pip', 'wheel'}  # what the test is about, or what the venv brings itself


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def link_installed(names: Iterable[str], dest: Path) -> List[str]:
    """Symlink into ``dest`` the installed files (top-level packages and .dist-info) of ``names`` and of
    everything they require (markers evaluated here, extras not followed), except :data:`NOT_SHARED`. Returns
    the distributions linked."""
    dest.mkdir(parents=True, exist_ok=True)
    todo, seen = list(names), set()
    while todo:
        name = canonical(todo.pop())
        if name in seen or name in NOT_SHARED:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != '..'}:
            if not (dest / top).exists():
                (dest / top).symlink_to(Path(dist.locate_file(top)).resolve())
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({'extra': ''}):
                todo.append(req.name)
    return sorted(seen)


def copy_tracked(dest: Path) -> Path:
    """The tracked files (what a clone has) in ``dest``, where the editable install writes its egg-info."""
    names = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split('\0')):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return dest


CHECK = r'''
from importlib import metadata
from pathlib import Path
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS
configs = sorted(Path('configs').glob('*_in1k.py'))
assert len(configs) >= 10, configs
for path in configs:
    cfg = Config.fromfile(str(path))  # `mmpretrain::` bases: mmengine imports pkg_resources
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device('meta'):
        MODELS.build(cfg.model)
cfg = Config.fromfile('configs/ppma_t_8xb128_in1k.py')
with DefaultScope.overwrite_default_scope('mmpretrain'):
    model = MODELS.build(cfg.model).eval()
with torch.no_grad():
    out = model(torch.randn(1, 3, 64, 64), mode='tensor')
assert tuple(out.shape) == (1, 1000), out.shape
import mmcv, mmppma, setuptools
assert int(setuptools.__version__.split('.')[0]) < 81, setuptools.__version__
assert any(r.startswith('setuptools') for r in metadata.requires('mmppma')), metadata.requires('mmppma')
print('OK', len(configs), 'configs; setuptools', setuptools.__version__, '; mmcv', mmcv.__version__, '; mmppma from',
      mmppma.__file__)
'''


@pytest.mark.heavy
@pytest.mark.slow
def test_readme_pip_route_with_mmcv_lite(tmp_path):
    if shutil.which('git') is None or not (REPO / '.git').exists():
        pytest.skip('needs a git checkout to know the tracked files')
    start = time.monotonic()
    src = copy_tracked(tmp_path / 'src')
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, capture_output=True)
    py = str(venv / 'bin' / 'python')
    site = subprocess.run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'], check=True,
                          capture_output=True, text=True).stdout.strip()
    shared = link_installed(['torch', 'torchvision'], tmp_path / 'torch_stack')
    assert {'torch', 'torchvision', 'numpy'} <= set(shared)
    Path(site, 'torch_stack.pth').write_text(str(tmp_path / 'torch_stack') + '\n')

    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK='1', PYTHONNOUSERSITE='1')
    env.pop('PYTHONPATH', None)

    def pip(*args: str) -> None:
        proc = subprocess.run([py, '-m', 'pip', 'install', '--progress-bar', 'off', *args], cwd=str(src), env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f'pip install {" ".join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'

    pip('setuptools>=81')  # where `pip install torch` leaves a fresh venv
    pip('mmcv-lite==2.1.0', '-e', '.[cls]')  # the README's route
    proc = subprocess.run([py, '-c', CHECK], cwd=str(src), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f'mmppma from {src}' in proc.stdout, proc.stdout
    print(f'pip route: {time.monotonic() - start:.0f} s; {proc.stdout.strip()}')
