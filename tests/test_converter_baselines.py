"""MLLA / VMINet release checkpoint conversion, against the releases' key+shape lists (tests/fixtures, made
from the upstream module trees, not from mmppma) and the mmpretrain classifiers built from our configs."""
import argparse
import functools
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip('mmpretrain.models')

from mmengine.config import Config  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402
from mmpretrain.registry import MODELS  # noqa: E402

from mmppma.models import MLLA, VMINet  # noqa: E402
from mmppma.models.layers.mlla import mlla_rope_tables  # noqa: E402
from mmppma.models.utils.checkpoint_convert import (  # noqa: E402
    CheckpointMismatchError,
    mlla_rope_rotations,
    mmppma_to_release,
    release_to_mmppma,
)
from mmppma.models.utils.checkpoint_convert import extract_state_dict as extract_release_state  # noqa: E402

from .conftest import fixture_shapes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONVERTERS = REPO / 'tools' / 'model_converters'
# (family, fixture letter, config arch) -> parameter count with the 1000-class head (the public release's)
CASES = {
    ('MLLA', 'T', 't'): 24_392_200,
    ('MLLA', 'S', 's'): 43_015_048,
    ('MLLA', 'B', 'b'): 95_983_960,
    ('VMINet', 'Ti', 'ti'): 2_036_938,
    ('VMINet', 'XS', 'xs'): 7_440_370,
    ('VMINet', 'S', 's'): 13_347_442,
    ('VMINet', 'B', 'b'): 28_387_138,
}
IDS = [f'{f}-{letter}' for f, letter, _ in CASES]
BUFFERS = ('running_mean', 'running_var', 'num_batches_tracked', 'rope.rotations')
HEADLESS = ('norm.', 'head.')


def fake_release_state(family: str, letter: str, random: bool = False) -> dict:
    """Tensors with the release's keys and shapes: random (running variances positive) or uninitialized."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in fixture_shapes(f'{family.lower()}_{letter}').items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(7)
        elif not random:
            state[key] = torch.empty(shape)
        else:
            t = torch.randn(shape, generator=gen)
            state[key] = t.abs() + 0.1 if key.endswith('running_var') else t
    return state


def build(family: str, arch: str, device: str = 'meta', **backbone):
    """The mmpretrain model of configs/<family>_<arch>_8xb128_in1k.py, built here with the registry."""
    cfg = Config.fromfile(str(REPO / 'configs' / f'{family.lower()}_{arch}_8xb128_in1k.py')).model
    cfg.backbone.update(backbone)
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device(device):
        return MODELS.build(cfg)


@functools.lru_cache(maxsize=None)
def config_shapes(family: str, arch: str, **backbone) -> dict:
    return {k: tuple(v.shape) for k, v in build(family, arch, **backbone).state_dict().items()}


def shapes_of(state: dict) -> dict:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_parameter_totals(case):
    family, letter, arch = case
    shapes = fixture_shapes(f'{family.lower()}_{letter}')
    release = sum(torch.Size(s).numel() for k, s in shapes.items() if not k.endswith(BUFFERS))
    ours = sum(p.numel() for p in build(family, arch).parameters())
    assert release == ours == CASES[case]


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_every_release_key_maps_with_matching_shape(case):
    family, letter, arch = case
    state = fake_release_state(family, letter)
    converted, info = release_to_mmppma(state, family)
    assert (info['arch'], info['downstream'], info['backbone_overrides']) == (arch, False, {})
    assert shapes_of(converted) == config_shapes(family, arch)
    # nothing invented; the only release keys without a counterpart are MLLA's fixed RoPE tables
    assert len(converted) + len(info['dropped']) == len(state)
    assert all(k.endswith('.attn.rope.rotations') for k in info['dropped'])
    assert len(info['dropped']) == (sum(1 for k in state if k.endswith('rotations')) if family == 'MLLA' else 0)
    # tensors are carried over unchanged, to where they belong
    assert converted['head.fc.weight'] is state['head.weight']
    assert converted['head.fc.bias'] is state['head.bias']
    assert converted['backbone.norm3.weight'] is state['norm.weight']
    if family == 'MLLA':
        key = 'layers.2.downsample.conv.2.norm.running_mean'
    else:
        assert converted['backbone.norm3.running_var'] is state['norm.running_var']
        key = 'stages.2.7.g.bn.running_mean'
    assert converted[f'backbone.{key}'] is state[key]


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_round_trip(case):
    family, letter, _ = case
    state = fake_release_state(family, letter)
    back = mmppma_to_release(release_to_mmppma(state, family)[0], family)
    assert shapes_of(back) == shapes_of(state)
    assert all(back[k] is state[k] for k in state if not k.endswith('rotations'))


def test_rope_tables_are_the_release_buffers_and_our_rope():
    """The regenerated release buffer follows the release formula, and it is the RoPE our MLLA computes, so
    dropping it loses nothing."""
    h, w, dim = 7, 5, 16
    rot = mlla_rope_rotations(h, w, dim).double()
    assert rot.shape == (h, w, dim // 2, 2)
    quarter = dim // 4
    for i, j, m in [(0, 0, 0), (3, 4, 1), (6, 2, 3), (5, 1, 4), (2, 4, 7)]:
        angle = (i if m < quarter else j) * 10000.0**(-(m % quarter) / quarter)
        assert rot[i, j, m].tolist() == pytest.approx([math.cos(angle), math.sin(angle)], abs=1e-6)
    sin, cos = mlla_rope_tables(h, w, dim)
    torch.testing.assert_close(rot[..., 0].float(), cos[..., 0::2], atol=1e-6, rtol=0)
    torch.testing.assert_close(rot[..., 1].float(), sin[..., 0::2], atol=1e-6, rtol=0)


@pytest.mark.parametrize('family,letter,arch', [('MLLA', 'T', 't'), ('VMINet', 'Ti', 'ti')])
def test_converted_state_loads_strictly(family, letter, arch):
    state = fake_release_state(family, letter, random=True)
    converted, _ = release_to_mmppma(state, family)
    model = build(family, arch, device='cpu', **({'context_mask': 'none'} if family == 'VMINet' else {}))  # 6b11d4a
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(model.head.fc.weight, state['head.weight'])
    assert torch.equal(model.backbone.norm3.bias, state['norm.bias'])
    if family == 'MLLA':
        assert torch.equal(model.backbone.layers[0].downsample.conv[2].norm.running_mean,
                           state['layers.0.downsample.conv.2.norm.running_mean'])
        assert torch.equal(model.backbone.patch_embed.conv3[1].norm.running_var,
                           state['patch_embed.conv3.1.norm.running_var'])
        assert torch.equal(model.backbone.layers[3].blocks[1].attn.qk.weight,
                           state['layers.3.blocks.1.attn.qk.weight'])
    else:
        assert torch.equal(model.backbone.norm3.running_mean, state['norm.running_mean'])
        assert torch.equal(model.backbone.stages[2][5].g.bn.running_var, state['stages.2.5.g.bn.running_var'])
        assert torch.equal(model.backbone.stages[1][0].bn.running_mean, state['stages.1.0.bn.running_mean'])
        assert torch.equal(model.backbone.stages[3][2].sum.weight, state['stages.3.2.sum.weight'])


@pytest.mark.parametrize('family,letter,extra,missing,shaped', [
    ('MLLA', 'T', 'layers.1.blocks.0.attn.bias_table', 'layers.2.blocks.3.mlp.fc2.bias',
     ('layers.0.blocks.1.attn.qk.bias', (64, ), r'checkpoint \(64,\) vs model \(128,\)')),
    ('VMINet', 'Ti', 'stages.1.2.f3.conv.weight', 'stages.2.17.g.bn.running_var',
     ('stages.1.2.sum.weight', (1, 700), r'checkpoint \(1, 700\) vs model \(1, 784\)')),
])
def test_mismatches_are_errors_listing_the_keys(family, letter, extra, missing, shaped):
    state = fake_release_state(family, letter)
    with pytest.raises(CheckpointMismatchError, match=rf"1 unexpected keys \['backbone.{extra}'\]"):
        release_to_mmppma(dict(state, **{extra: torch.zeros(3)}), family)
    incomplete = dict(state)
    del incomplete[missing]
    with pytest.raises(CheckpointMismatchError, match=rf"1 missing keys \['backbone.{missing}'\]"):
        release_to_mmppma(incomplete, family)
    key, shape, message = shaped
    with pytest.raises(CheckpointMismatchError, match=message):
        release_to_mmppma(dict(state, **{key: torch.zeros(shape)}), family)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \['dist_token'\]"):
        release_to_mmppma(dict(state, dist_token=torch.zeros(1)), family)
    headless = {k: v for k, v in state.items() if not k.startswith('head.')}
    with pytest.raises(CheckpointMismatchError, match='without head'):
        release_to_mmppma(headless, family)
    assert set(release_to_mmppma(headless, family, backbone_only=True)[0]) == \
        {k for k in config_shapes(family, letter.lower()) if k.startswith('backbone.')}


def test_arch_detection_and_family_errors():
    mlla = fake_release_state('MLLA', 'T')
    assert release_to_mmppma(mlla, 'MLLA', arch='tiny')[1]['arch'] == 't'
    with pytest.raises(CheckpointMismatchError, match='missing keys'):
        release_to_mmppma(mlla, 'MLLA', arch='s')  # a T checkpoint checked against MLLA-S
    shallow = {k: v for k, v in mlla.items() if not k.startswith('layers.2.blocks.7.')}
    with pytest.raises(CheckpointMismatchError, match=r'depths=\[2, 4, 7, 4\].*matches no named arch'):
        release_to_mmppma(shallow, 'MLLA')
    with pytest.raises(CheckpointMismatchError, match='not an MLLA backbone'):
        release_to_mmppma(fake_release_state('VMINet', 'Ti'), 'MLLA')
    with pytest.raises(CheckpointMismatchError, match='not a VMINet backbone'):
        release_to_mmppma(mlla, 'VMINet')
    with pytest.raises(CheckpointMismatchError, match=r'rope.rotations: RoPE table of shape \(56, 56, 64, 2\)'):
        release_to_mmppma(dict(mlla, **{'layers.0.blocks.0.attn.rope.rotations': torch.zeros(56, 56, 64, 2)}), 'MLLA')


def test_vminet_revision_7c2632c():
    """The other release revision: blocks' 7x7 ConvBN named ``conv``, no BatchNorm after ``g``."""
    new = fake_release_state('VMINet', 'Ti')
    old = {k.replace('.dwconv.', '.conv.'): v for k, v in new.items() if '.g.bn.' not in k}
    converted, info = release_to_mmppma(old, 'VMINet')
    assert info['backbone_overrides'] == {} and info['revision'] == '7c2632c'
    assert info['release'] == dict(revision='7c2632c', context_mask='tril', proj_norm=False)
    assert REPO / info['config'] == REPO / 'configs' / 'vminet_ti_release-7c2632c_in1k.py'
    assert shapes_of(converted) == config_shapes('VMINet', 'ti', proj_norm=False)
    assert converted['backbone.stages.2.3.dwconv.bn.running_mean'] is old['stages.2.3.conv.bn.running_mean']
    assert converted['backbone.stages.2.0.conv.weight'] is old['stages.2.0.conv.weight']  # downsample unchanged
    back = mmppma_to_release(converted, 'VMINet')  # the revision the converted state records
    assert set(back) == set(old) and all(back[k] is old[k] for k in old)


def test_downstream_checkpoints():
    # MLLA: the release's dense backbone (norm0-norm3, RoPE buffers at 224) inside a detector
    backbone = {k: v for k, v in fake_release_state('MLLA', 'T').items() if not k.startswith(HEADLESS)}
    for i, c in enumerate((64, 128, 256, 512)):
        backbone[f'norm{i}.weight'], backbone[f'norm{i}.bias'] = torch.ones(c), torch.zeros(c)
    state = {f'backbone.{k}': v for k, v in backbone.items()}
    state['neck.lateral_convs.0.conv.weight'] = torch.zeros(256, 64, 1, 1)
    state['roi_head.bbox_head.fc_cls.weight'] = torch.zeros(81, 1024)
    full, info = release_to_mmppma(state, 'MLLA')
    assert info['downstream'] and info['out_indices'] == (0, 1, 2, 3) and info['arch'] == 't'
    assert info['passthrough'] == ['neck.lateral_convs.0.conv.weight', 'roi_head.bbox_head.fc_cls.weight']
    assert set(full) == {k for k in state if not k.endswith('rotations')}
    only, _ = release_to_mmppma(state, 'MLLA', backbone_only=True)
    with torch.device('meta'):
        dense = MLLA('tiny', out_indices=(0, 1, 2, 3))
    assert shapes_of({k[len('backbone.'):]: v for k, v in only.items()}) == shapes_of(dense.state_dict())
    back = mmppma_to_release(full, 'MLLA', downstream=True)
    assert shapes_of(back) == shapes_of(state)
    assert all(back[k] is state[k] for k in state if not k.endswith('rotations'))

    # VMINet: no release dense code; a backbone.-prefixed state with mmppma's dense output norms (LN)
    backbone = {k: v for k, v in fake_release_state('VMINet', 'Ti').items() if not k.startswith(HEADLESS)}
    for i, c in enumerate((24, 48, 96, 192)):
        backbone[f'outnorm{i}.weight'], backbone[f'outnorm{i}.bias'] = torch.ones(c), torch.zeros(c)
    state = {f'backbone.{k}': v for k, v in backbone.items()}
    state['decode_head.conv_seg.weight'] = torch.zeros(150, 512, 1, 1)
    full, info = release_to_mmppma(state, 'VMINet')
    assert info['downstream'] and info['passthrough'] == ['decode_head.conv_seg.weight'] and set(full) == set(state)
    with torch.device('meta'):
        dense = VMINet('ti', out_indices=(0, 1, 2, 3), out_norm='LN')
    assert shapes_of({k[len('backbone.'):]: v for k, v in full.items() if k.startswith('backbone.')}) == \
        shapes_of(dense.state_dict())
    del state['backbone.outnorm2.bias']
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \['backbone.outnorm2.bias'\]"):
        release_to_mmppma(state, 'VMINet')


def test_state_containers():
    state, ema = {'a': torch.zeros(1)}, {'b': torch.ones(1)}
    assert extract_release_state({'model': state, 'state_dict_ema': ema, 'epoch': 3}) == (state, 'model')
    assert extract_release_state({'state_dict': state, 'state_dict_ema': ema}) == (state, 'state_dict')
    assert extract_release_state({'state_dict_ema': ema, 'epoch': 3}) == (ema, 'state_dict_ema')
    assert extract_release_state({'model': state, 'state_dict_ema': ema}, key='state_dict_ema')[0] == ema
    assert extract_release_state({'state_dict': {'module.a': state['a']}}) == (state, 'state_dict')
    with pytest.raises(KeyError, match='model, model_ema, models, state_dict'):
        extract_release_state({'optimizer': {}, 'epoch': 1})


def run_cli(script, *args, check=True):
    return subprocess.run([sys.executable, str(CONVERTERS / script), *map(str, args)], capture_output=True,
                          text=True, check=check)


def test_cli(tmp_path, cli_main, capsys):
    # MLLA, through the script: the release file pickles its training config
    state = fake_release_state('MLLA', 'T', random=True)
    torch.save({'model': state, 'config': argparse.Namespace(tag='release')}, tmp_path / 'mlla.pth')
    result = run_cli('mlla_official_to_mmppma.py', tmp_path / 'mlla.pth', tmp_path / 'x.pth', check=False)
    assert result.returncode != 0 and '--allow-pickle' in result.stderr and not (tmp_path / 'x.pth').exists()
    out = run_cli('mlla_official_to_mmppma.py', tmp_path / 'mlla.pth', tmp_path / 'mlla_mm.pth', '--allow-pickle',
                  '--backbone-out', tmp_path / 'mlla_bb.pth').stdout
    assert 'MLLA-t' in out and 'RoPE buffers' in out and '\nconfig: ' in out
    assert Path(re.search(r'^config: (\S+)$', out, flags=re.M).group(1)).resolve() == \
        REPO / 'configs' / 'mlla_t_8xb128_in1k.py'
    full = torch.load(tmp_path / 'mlla_mm.pth')
    assert full['meta']['source_key'] == 'model' and full['meta']['arch'] == 't'
    assert shapes_of(full['state_dict']) == config_shapes('MLLA', 't')
    bb = torch.load(tmp_path / 'mlla_bb.pth')['state_dict']
    assert set(bb) == {k for k in full['state_dict'] if k.startswith('backbone.')}

    # VMINet, in process: timm's container, --backbone-only into a backbone through init_cfg
    state = fake_release_state('VMINet', 'Ti', random=True)
    torch.save({'state_dict': state, 'epoch': 300}, tmp_path / 'vminet.pth.tar')
    assert cli_main('VMINet', '', [str(tmp_path / 'vminet.pth.tar'), str(tmp_path / 'only.pth'), '--backbone-only',
                                   '--arch', 'TI']) == 0
    assert 'VMINet-ti' in capsys.readouterr().out
    only = torch.load(tmp_path / 'only.pth')['state_dict']
    assert set(only) == {k for k in config_shapes('VMINet', 'ti') if k.startswith('backbone.')}
    model = VMINet('ti', out_indices=(3, ), out_norm='BN', context_mask='none',  # the release revision 6b11d4a
                   init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'only.pth'), prefix='backbone.'))
    model.init_weights()
    assert torch.equal(model.stages[3][1].f2.conv.weight, state['stages.3.1.f2.conv.weight'])
    assert torch.equal(model.norm3.running_var, state['norm.running_var'])

    del state['stages.0.2.f1.conv.bias']
    torch.save({'state_dict': state}, tmp_path / 'broken.pth')
    with pytest.raises(SystemExit, match=r"missing keys \['backbone.stages.0.2.f1.conv.bias'\]"):
        cli_main('VMINet', '', [str(tmp_path / 'broken.pth'), str(tmp_path / 'y.pth')])
    assert not (tmp_path / 'y.pth').exists()
