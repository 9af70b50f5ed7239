"""The converter's one API and one command line: family names, the old script and function names as aliases,
and reference models built without reading any config file."""
import functools
import runpy
import sys
from pathlib import Path

import pytest
import torch

from mmppma.models import MLLA, PPMA, PPMAClsHead, VMINet
from mmppma.models.utils import checkpoint_convert as cc

CONVERTERS = Path(__file__).resolve().parents[1] / 'tools' / 'model_converters'


def zeros_like_state(module: torch.nn.Module, prefix: str) -> dict:
    return {f'{prefix}{k}': torch.zeros_like(v) for k, v in module.state_dict().items()}


def release_state(family: str) -> dict:
    return dict(_release_state(family))


@functools.lru_cache(maxsize=None)
def _release_state(family: str) -> dict:
    """A classification checkpoint in the release layout, written by the inverse mapping from mmppma's
    classifier keys (the forward mapping against the releases' key lists is tests/test_converter*.py's)."""
    if family == 'PPMA':
        state = zeros_like_state(PPMA('tiny', out_indices=(3, ), out_norm=False), 'backbone.')
        state.update(zeros_like_state(PPMAClsHead(10, 512, 1024, loss=torch.nn.Identity()), 'head.'))
    elif family == 'MLLA':
        state = zeros_like_state(MLLA('tiny', out_indices=(3, ), out_norm=True), 'backbone.')
        state.update({'head.fc.weight': torch.zeros(10, 512), 'head.fc.bias': torch.zeros(10)})
    else:
        state = zeros_like_state(VMINet('ti', out_indices=(3, ), out_norm='BN', context_mask='none'), 'backbone.')
        state.update({'head.fc.weight': torch.zeros(10, 192), 'head.fc.bias': torch.zeros(10)})
    return cc.mmppma_to_release(state, family)


@pytest.fixture
def cli(converter_main):
    return converter_main


@pytest.mark.parametrize('family,script', [
    pytest.param('PPMA', 'ppma_official_to_mmppma.py', marks=pytest.mark.slow),
    pytest.param('MLLA', 'mlla_official_to_mmppma.py', marks=pytest.mark.slow),
    ('VMINet', 'vminet_official_to_mmppma.py'),
])
def test_old_script_names_are_the_one_cli(family, script, tmp_path, cli, monkeypatch, capsys):
    torch.save({'model': release_state(family)}, tmp_path / 'release.pth')
    assert cli(['--family', family.lower(), str(tmp_path / 'release.pth'), str(tmp_path / 'new.pth')]) == 0
    new_out = capsys.readouterr().out.replace('new.pth', 'X')
    monkeypatch.setattr(sys, 'argv', [script, str(tmp_path / 'release.pth'), str(tmp_path / 'old.pth')])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(CONVERTERS / script), run_name='__main__')
    assert exit_.value.code == 0
    assert capsys.readouterr().out.replace('old.pth', 'X') == new_out
    new, old = torch.load(tmp_path / 'new.pth'), torch.load(tmp_path / 'old.pth')
    assert new['meta'] == old['meta'] and new['meta']['family'] == family
    assert new['meta']['config'].endswith(f'configs/{family.lower()}_t{"i" if family == "VMINet" else ""}_'
                                          + ('release-6b11d4a_in1k.py' if family == 'VMINet' else '8xb128_in1k.py'))
    assert new['state_dict'].keys() == old['state_dict'].keys()


def test_cli_argument_errors(tmp_path, cli):
    with pytest.raises(SystemExit):
        cli(['--family', 'resnet', 'a.pth', 'b.pth'])
    with pytest.raises(SystemExit):
        cli(['--family', 'MLLA', '--arch-json', '{}', 'a.pth', 'b.pth'])
    torch.save({'model': release_state('VMINet')}, tmp_path / 'release.pth')
    with pytest.raises(SystemExit, match="arch='xl' is not a VMINet arch"):
        cli(['--family', 'VMINet', '--arch', 'xl', str(tmp_path / 'release.pth'), str(tmp_path / 'out.pth')])


def test_family_names():
    assert cc.check_family('rmt') == 'PPMA' and cc.check_family('vminet') == 'VMINet'
    with pytest.raises(ValueError, match='choose one of PPMA, MLLA, VMINet'):
        cc.release_to_mmppma({}, 'ResNet')


@pytest.mark.parametrize('family', cc.FAMILIES)
def test_reference_models_come_from_the_arch_tables(family, monkeypatch):
    """No config file is read unless one is given: the check works for an installed package, and the default
    config is only named (relative to the repository root)."""
    from mmengine.config import Config

    def no_files(*args, **kwargs):
        raise AssertionError('a config file was read')

    monkeypatch.setattr(Config, 'fromfile', no_files)
    converted, info = cc.release_to_mmppma(release_state(family), family)
    assert info['num_classes'] == 10 and info['config'].startswith('configs/')
    assert any('set model.head.num_classes=10' in note for note in info['notes'])
    assert len(converted) == len(release_state(family)) - len(info['dropped'])


def test_deprecated_function_names_warn_and_match():
    state = release_state('PPMA')
    with pytest.warns(DeprecationWarning, match=r"release_to_mmppma\(state, 'PPMA'\)"):
        old, old_info = cc.official_to_mmppma(state)
    new, info = cc.release_to_mmppma(state, 'PPMA')
    assert old.keys() == new.keys() and old_info == info
    with pytest.warns(DeprecationWarning, match=r"mmppma_to_release\(state, 'PPMA'\)"):
        assert cc.mmppma_to_official(new).keys() == cc.mmppma_to_release(new, 'PPMA').keys() == state.keys()
    with pytest.warns(DeprecationWarning, match='extract_state_dict'):
        assert cc.extract_release_state({'state_dict_ema': state}) == cc.extract_state_dict({'state_dict_ema': state})
