"""Release checkpoint conversion, against the release's key+shape lists (tests/fixtures)."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmppma.models import PPMA, RMT, PPMAClsHead
from mmppma.models.utils import CheckpointMismatchError, extract_state_dict, mmppma_to_official, official_to_mmppma

from .conftest import fixture_shapes

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / 'tools' / 'model_converters' / 'ppma_official_to_mmppma.py'
ARCHS = {'T': 'tiny', 'S': 'small', 'B': 'base'}


def fake_release_state(letter: str) -> dict:
    """Random tensors with the release's keys and shapes (running variances positive)."""
    gen = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in fixture_shapes(f'ppma_{letter}').items():
        if key.endswith('num_batches_tracked'):
            state[key] = torch.tensor(7)
        else:
            t = torch.randn(shape, generator=gen)
            state[key] = t.abs() + 0.1 if key.endswith('running_var') else t
    return state


def expected_mmppma_shapes(arch: str, cls=PPMA, **kwargs) -> dict:
    """Keys and shapes of an mmpretrain ImageClassifier(backbone=PPMA, head=PPMAClsHead), built here."""
    with torch.device('meta'):
        backbone = cls(arch, out_indices=(3, ), out_norm=False, **kwargs)
        head = PPMAClsHead(1000, in_channels=512, loss=torch.nn.Identity())
    shapes = {f'backbone.{k}': tuple(v.shape) for k, v in backbone.state_dict().items()}
    shapes.update({f'head.{k}': tuple(v.shape) for k, v in head.state_dict().items()})
    return shapes


@pytest.mark.parametrize('letter', ['T', 'S', 'B'])
def test_every_release_key_maps_with_matching_shape(letter):
    state = fake_release_state(letter)
    converted, info = official_to_mmppma(state)
    assert (info['family'], info['arch'], info['mask']) == ('PPMA', ARCHS[letter], 'polyline')
    assert len(converted) == len(state)  # nothing dropped, nothing invented
    assert {k: tuple(v.shape) for k, v in converted.items()} == expected_mmppma_shapes(ARCHS[letter])
    # tensors are carried over unchanged
    assert converted['head.fc.weight'] is state['head.weight']
    assert converted['head.proj.bias'] is state['proj.bias']
    assert converted['backbone.layers.0.Relpos.angle'] is state['layers.0.Relpos.angle']


@pytest.mark.parametrize('letter', ['T', 'B'])
def test_round_trip(letter):
    state = fake_release_state(letter)
    back = mmppma_to_official(official_to_mmppma(state)[0])
    assert set(back) == set(state)
    assert all(back[k] is state[k] for k in state)


def test_state_containers():
    state = {'a': torch.zeros(1)}
    for key in ('model', 'model_ema', 'models', 'state_dict'):
        assert extract_state_dict({key: state, 'epoch': 3}) == (state, key)
    assert extract_state_dict({'model': state, 'model_ema': {'b': torch.ones(1)}}, key='model_ema')[1] == 'model_ema'
    assert extract_state_dict(state) == (state, '')
    with pytest.raises(KeyError, match='model, model_ema, models, state_dict'):
        extract_state_dict({'optimizer': {}, 'epoch': 1})


def test_downstream_checkpoint():
    backbone = {k: v for k, v in fake_release_state('T').items() if not k.startswith(('proj.', 'norm.', 'head.'))}
    for i, c in enumerate((64, 128, 256, 512)):
        backbone[f'outnorm{i}.weight'], backbone[f'outnorm{i}.bias'] = torch.ones(c), torch.zeros(c)
    state = {f'backbone.{k}': v for k, v in backbone.items()}
    state['neck.lateral_convs.0.conv.weight'] = torch.zeros(256, 64, 1, 1)
    state['decode_head.conv_seg.weight'] = torch.zeros(150, 512, 1, 1)

    full, info = official_to_mmppma(state)
    assert info['downstream'] and info['out_indices'] == (0, 1, 2, 3)
    assert info['passthrough'] == ['decode_head.conv_seg.weight', 'neck.lateral_convs.0.conv.weight']
    assert set(full) == set(state)

    only, _ = official_to_mmppma(state, backbone_only=True)
    assert set(only) == {k for k in state if k.startswith('backbone.')}
    with torch.device('meta'):
        dense = PPMA('tiny', out_indices=(0, 1, 2, 3))
    assert {k[len('backbone.'):]: tuple(v.shape) for k, v in only.items()} == \
        {k: tuple(v.shape) for k, v in dense.state_dict().items()}


def test_rmt_and_shared_mask_checkpoints_are_recognized():
    rmt = {k: torch.zeros_like(v, device='cpu') for k, v in RMT('tiny', out_indices=(3, ), out_norm=False,
                                                               ).state_dict().items()}
    head = fake_release_state('T')
    rmt.update({k: v for k, v in head.items() if k.startswith(('proj.', 'norm.', 'head.'))})
    _, info = official_to_mmppma(rmt)
    assert (info['family'], info['mask']) == ('RMT', 'rmt')

    shared = PPMA(dict(PPMA.arch_zoo['tiny'], depths=[1, 1, 1, 1]), mask='shared', out_indices=(3, ),
                  out_norm=False).state_dict()
    with pytest.raises(CheckpointMismatchError, match='matches no arch'):
        official_to_mmppma(shared, backbone_only=True)
    settings = dict(PPMA.arch_zoo['tiny'], depths=[1, 1, 1, 1])
    _, info = official_to_mmppma(shared, backbone_only=True, arch=settings)
    assert info['mask'] == 'shared'


def test_mismatches_are_errors_listing_the_keys():
    state = fake_release_state('T')
    extra = dict(state, **{'layers.1.blocks.0.retention.bias_table': torch.zeros(3)})
    unexpected = r"1 unexpected keys \['layers.1.blocks.0.retention.bias_table'\]"
    with pytest.raises(CheckpointMismatchError, match=unexpected):
        official_to_mmppma(extra)
    missing = dict(state)
    del missing['layers.2.blocks.3.ffn.fc2.bias']
    with pytest.raises(CheckpointMismatchError, match=r"1 missing keys \['layers.2.blocks.3.ffn.fc2.bias'\]"):
        official_to_mmppma(missing)
    shaped = dict(state, **{'layers.0.blocks.0.retention.path_embed.A_log': torch.zeros(5)})
    with pytest.raises(CheckpointMismatchError, match=r'path_embed.A_log: checkpoint \(5,\) vs model \(4,\)'):
        official_to_mmppma(shaped)
    stray = dict(state, **{'dist_token': torch.zeros(1)})
    with pytest.raises(CheckpointMismatchError, match="unexpected key 'dist_token'"):
        official_to_mmppma(stray)


def run_cli(*args, check=True):
    return subprocess.run([sys.executable, str(CLI), *map(str, args)], capture_output=True, text=True, check=check)


def test_cli_outputs(tmp_path):
    state = fake_release_state('T')
    torch.save({'model': state, 'epoch': 300}, tmp_path / 'official.pth')
    out = run_cli(tmp_path / 'official.pth', tmp_path / 'full.pth', '--backbone-out', tmp_path / 'bb.pth')
    assert 'PPMA-tiny' in out.stdout
    full = torch.load(tmp_path / 'full.pth')
    assert set(full['state_dict']) == set(expected_mmppma_shapes('tiny'))
    assert full['meta']['source_key'] == 'model'
    bb = torch.load(tmp_path / 'bb.pth')['state_dict']
    assert set(bb) == {k for k in full['state_dict'] if k.startswith('backbone.')}

    run_cli(tmp_path / 'official.pth', tmp_path / 'only.pth', '--backbone-only')
    only = torch.load(tmp_path / 'only.pth')['state_dict']
    assert set(only) == set(bb)
    # the backbone-only file initializes a backbone through init_cfg with the prefix
    model = PPMA('tiny', out_indices=(3, ), out_norm=False,
                 init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'only.pth'), prefix='backbone.'))
    model.init_weights()
    assert torch.equal(model.layers[3].blocks[1].ffn.fc2.weight, state['layers.3.blocks.1.ffn.fc2.weight'])


def test_cli_errors(tmp_path):
    state = fake_release_state('T')
    del state['layers.0.blocks.1.pos.conv.bias']
    torch.save({'model': state}, tmp_path / 'broken.pth')
    result = run_cli(tmp_path / 'broken.pth', tmp_path / 'x.pth', check=False)
    assert result.returncode != 0 and 'layers.0.blocks.1.pos.conv.bias' in result.stderr
    assert not (tmp_path / 'x.pth').exists()
    # release checkpoints that pickle their training args need an explicit opt-in
    torch.save({'model': fake_release_state('T'), 'args': argparse.Namespace(lr=1e-3)}, tmp_path / 'args.pth')
    result = run_cli(tmp_path / 'args.pth', tmp_path / 'y.pth', check=False)
    assert result.returncode != 0 and '--allow-pickle' in result.stderr
    run_cli(tmp_path / 'args.pth', tmp_path / 'y.pth', '--allow-pickle')
    assert (tmp_path / 'y.pth').exists()
