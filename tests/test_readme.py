"""README.md says what mmppma is and its two commands on the first screen, and quotes no measured figure (a
number with a unit of time, or a count of passed tests): those live in docs/, each beside its command and
machine. No doc says whether this project has a GPU."""
import re

import pytest

from .conftest import REPO_ROOT

FIRST_SCREEN = 24  # lines
MEASURED = re.compile(
    r'\b\d+(?:[.,]\d+)?(?:\s*-\s*\d+(?:[.,]\d+)?)?\s*'
    r'(?:ms|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?)\b(?!-)'
    r'|\b\d+\s+(?:tests?\s+)?passed\b', re.IGNORECASE)
GPU_NARRATION = re.compile(r'\bno GPU\b|GPU is (?:not )?available|GPU available|without a GPU here|has no GPU',
                           re.IGNORECASE)


@pytest.mark.parametrize('text, measured', [
    ('takes about 21 min on a 2-core machine', True), ('2.2 s per step', True), ('a 30-second smoke run', False),
    ('within 10 minutes', True), ('891 passed', True), ('891 tests passed', True), ('15-20 min', True),
    ('a 2x3x224x224 batch', False), ('stride 4, 192 px, 300 iterations', False), ('sm_80-sm_90', False),
    ('python 3.11, torch 2.13.0', False), ('1x / 3x schedules', False), ('160k iterations', False),
])
def test_the_measured_figure_pattern(text, measured):
    assert bool(MEASURED.search(text)) == measured


def test_readme_first_screen_says_what_it_is_and_its_two_commands():
    first = '\n'.join((REPO_ROOT / 'README.md').read_text().splitlines()[:FIRST_SCREEN])
    assert 'OpenMMLab 2.0' in first and 'plugin for' in first and 'Polyline Path Masked Attention' in first
    assert 'bash tools/tiny_coco_demo.sh' in first and 'bash tools/run_tests.sh' in first


def test_readme_quotes_no_measured_figure():
    hits = [f'{n}: {line}' for n, line in enumerate((REPO_ROOT / 'README.md').read_text().splitlines(), 1)
            if MEASURED.search(line)]
    assert not hits, f'measured figures belong in docs/benchmarks.md (with command and machine): {hits}'


def test_no_doc_says_whether_the_project_has_a_gpu():
    docs = [REPO_ROOT / 'README.md', *sorted((REPO_ROOT / 'docs').glob('*.md'))]
    hits = [f'{p.name}:{n}: {line}' for p in docs for n, line in enumerate(p.read_text().splitlines(), 1)
            if GPU_NARRATION.search(line)]
    assert not hits, hits
