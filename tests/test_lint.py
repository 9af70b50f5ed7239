"""The tree passes the linter (ruff: pycodestyle, pyflakes and isort rules; settings in ruff.toml)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list:
    exe = Path(sys.executable).parent / 'ruff'
    found = str(exe) if exe.exists() else shutil.which('ruff')
    if found is None:
        pytest.fail('ruff is not installed: it is pinned in requirements.txt [tests]; run bash tools/setup_env.sh')
    return [found]


def test_tree_passes_ruff():
    run = subprocess.run([*_ruff(), 'check', '--no-cache', '--output-format', 'concise', '.'], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f'ruff found problems (fix them, or `ruff check --fix .`):\n{run.stdout}{run.stderr}'


def test_ruff_reports_a_planted_error(tmp_path):
    """The check can fail: an unused import in a file under the same settings is reported."""
    bad = tmp_path / 'bad.py'
    bad.write_text('import os\n')
    run = subprocess.run([*_ruff(), 'check', '--no-cache', '--config', str(ROOT / 'ruff.toml'), str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and 'F401' in run.stdout, run.stdout + run.stderr
