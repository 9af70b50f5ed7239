"""What the docs claim about the package, checked against the code: README's install paragraph against setup.py
(install_requires and extras), README's list of the package's parts against the tree, and docs/benchmarks.md
within its bound."""
import re

from .conftest import REPO_ROOT

README = (REPO_ROOT / 'README.md').read_text()
BENCHMARKS_LINES = 500


def setup_groups():
    """install_requires and the extras' names as setup.py computes them (its read_groups on requirements.txt)."""
    source = (REPO_ROOT / 'setup.py').read_text()
    scope = {'__file__': str(REPO_ROOT / 'setup.py')}
    exec(source[:source.index('def read_version')], scope)  # imports, RANGES, read_groups
    groups = scope['read_groups'](REPO_ROOT / 'requirements.txt')
    required = [r for r in groups['build'] if r.startswith('setuptools')] + groups['core']
    extras = re.search(r"extras = \{name: groups\[name\] for name in \(([^)]*)\)\}", source).group(1)
    return required, re.findall(r"'(\w+)'", extras) + ['all']


def install_paragraph() -> str:
    start = README.index('The installed package (`pip install -e .`)')
    return README[start:README.index('\n\n', start)]


def test_readme_names_every_install_requirement_and_extra():
    required, extras = setup_groups()
    paragraph = install_paragraph()
    names = [re.split(r'[=<>!\s\[]', r, maxsplit=1)[0] for r in required]
    assert {'torch', 'numpy', 'mmengine', 'timm', 'setuptools'} <= set(names)
    assert all(f'`{n}' in paragraph for n in names), (names, paragraph)
    assert all(f'`[{e}]`' in paragraph for e in extras), (extras, paragraph)
    # triton is an extra, not a requirement
    assert 'triton' not in names and '`[triton]`' in paragraph


def test_readme_layout_names_paths_that_exist():
    paths = set(re.findall(r'`(mmppma/[\w/.<>]+|tools/[\w/.]+\.(?:py|sh)|configs/[\w/]+/)`', README))
    missing = sorted(p for p in paths if '<' not in p and not (REPO_ROOT / p).exists())
    assert paths and not missing, missing
    for package in ('mmppma/ops', 'mmppma/deploy/', 'mmppma/models/backbones/<family>_spec.py'):
        assert f'`{package}' in README, package


def test_benchmarks_stays_within_its_bound():
    lines = (REPO_ROOT / 'docs' / 'benchmarks.md').read_text().splitlines()
    assert len(lines) <= BENCHMARKS_LINES, f'{len(lines)} lines: move generated tables under docs/generated/'
