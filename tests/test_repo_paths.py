"""The repository stands alone: no tracked file names a path of a development machine (a clone elsewhere would
fail with FileNotFoundError); fixtures live under tests/fixtures, citations point into docs/."""
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

from .conftest import REPO_ROOT

CHECKED = ('mmppma', 'tools', 'tests', 'configs', 'docs', 'README.md', 'setup.py', 'requirements.txt', '.ci')
# An absolute path into a machine's work area or a user's home (Linux, macOS), or a relative path out of the
# repository into the sibling shared folder of the development setup. Written so that it does not match itself.
MACHINE_PATH = re.compile(r'(?<![\w.~-])/(?:work|root|home/[^/\s\'"]+|Users/[^/\s\'"]+)/|\.\.[/\\]shared\b')


def tracked_files() -> List[Path]:
    """The files of ``CHECKED`` that git tracks; a checkout without git (an unpacked archive): all of them."""
    if shutil.which('git') and (REPO_ROOT / '.git').exists():
        out = subprocess.run(['git', 'ls-files', '-z', '--', *CHECKED], cwd=REPO_ROOT, capture_output=True,
                             check=True).stdout.decode()
        return [REPO_ROOT / name for name in out.split('\0') if name]
    files = []
    for name in CHECKED:
        path = REPO_ROOT / name
        found = [path] if path.is_file() else path.rglob('*')
        files += [p for p in found if p.is_file() and '__pycache__' not in p.parts]
    return files


def machine_paths(text: str) -> List[str]:
    """``line number: line`` of every line of ``text`` that names a development-machine path."""
    return [f'{n}: {line.strip()}' for n, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


@pytest.mark.parametrize('text, caught', [
    ("FIXTURES = Path('" + '/wo' + "rk/shared/fixtures')", True), ('see ' + '/ro' + 'ot/.cache/x', True),
    ('cd ' + '/ho' + 'me/alice/mmppma', True), ('open ' + '/Us' + 'ers/bob/data.json', True),
    ("Path(__file__).parent / '" + '..' + "/shared/seeds'", True),
    ('python tools/train.py configs/x.py --work-dir work_dirs/x', False), ('data_root = "data/coco/"', False),
    ('torch.hub: ~/.cache/torch/hub; /tmp/scratch is fine', False),
    ('https://github.com/open-mmlab/mmdetection/tree/main/configs', False),
    ('shared/fixtures and ./shared are inside the repository', False),
])
def test_pattern_catches_machine_paths_only(text, caught):
    assert bool(machine_paths(text)) == caught


def test_no_tracked_file_names_a_machine_path():
    files = tracked_files()
    assert any(p.name == Path(__file__).name for p in files), 'this test file should be among the checked files'
    offenders = []
    for path in files:
        try:
            text = path.read_text(encoding='utf-8')
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary files; files deleted in the working tree
        offenders += [f'{path.relative_to(REPO_ROOT)}:{hit}' for hit in machine_paths(text)]
    assert not offenders, ('tracked files name paths of a development machine; move the data into the repository '
                           '(tests/fixtures, docs/) and refer to it relative to the checkout:\n' + '\n'.join(offenders))
