"""mmppma: Polyline Path Masked Attention backbones for OpenMMLab 2.0.

Requirements come from requirements.txt, the single place where the stack is pinned: its ``# [group]``
headers split it into ``install_requires`` (core, plus setuptools from the build group) and extras (cls, det,
seg, triton, deploy, tests, all).
"""
import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# torch and triton are pinned for the verified CPU stack; a CUDA user brings their own build, so the
# installed package only asks for the oldest versions that have what the code uses (tests/test_packaging.py
# lists those features with the version that introduced each, README "Supported versions"). setuptools: the range
# of its pin's comment in requirements.txt (mmengine's `mmpretrain::` / `mmdet::` config lookups import
# pkg_resources, gone from setuptools >= 81), so `pip install -e .[cls]` keeps the config system working.
RANGES = {'torch': 'torch>=2.7', 'torchvision': 'torchvision', 'triton': 'triton>=3.0',
          'setuptools': 'setuptools>=77.0.3,<81'}


def read_groups(path):
    groups, group = {}, None
    for line in path.read_text().splitlines():
        header = re.match(r'#\s*\[(\w+)\]', line)
        if header:
            group = header.group(1)
        elif line.strip() and not line.lstrip().startswith('#'):
            name = re.split(r'[=<>!\s\[]', line.strip(), maxsplit=1)[0]
            groups.setdefault(group, []).append(RANGES.get(name, line.strip()))
    return groups


def read_version():
    text = (ROOT / 'mmppma' / 'version.py').read_text()
    return re.search(r"__version__ = '([^']+)'", text).group(1)


class BuildPyWithConfigs(build_py):
    """Also copy configs/ into the built package as mmppma/.mim/configs, where the model index
    (mmppma/.mim/model-index.yml) finds them in an installed wheel; an editable install reads the checkout's."""

    def run(self):
        super().run()
        if not getattr(self, 'editable_mode', False) and (ROOT / 'configs').is_dir():
            shutil.copytree(ROOT / 'configs', Path(self.build_lib) / 'mmppma' / '.mim' / 'configs', dirs_exist_ok=True)


groups = read_groups(ROOT / 'requirements.txt')
extras = {name: groups[name] for name in ('cls', 'det', 'seg', 'triton', 'deploy', 'tests')}
extras['det'] = groups['mmcv'] + extras['det']
extras['seg'] = groups['mmcv'] + extras['seg']
extras['all'] = sorted({req for reqs in extras.values() for req in reqs})

setup(
    name='mmppma',
    version=read_version(),
    description='Polyline Path Masked Attention (PPMA) backbones and ops for OpenMMLab 2.0',
    long_description=(ROOT / 'README.md').read_text() if (ROOT / 'README.md').exists() else '',
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    python_requires='>=3.9',
    packages=find_packages(include=['mmppma', 'mmppma.*']),
    include_package_data=True,
    package_data={'mmppma': ['.mim/model-index.yml', '.mim/metafiles/*/metafile.yml']},
    cmdclass={'build_py': BuildPyWithConfigs},
    install_requires=[r for r in groups['build'] if r.startswith('setuptools')] + groups['core'],
    extras_require=extras,
    zip_safe=False,
)
