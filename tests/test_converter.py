"""The release checkpoint converter (tools/model_converters/release_to_mmppma.py) against the releases' key and shape
lists (tests/fixtures), their parameter counts, a VMINet release forward written here, and whole mmdet 2.x / mmseg
0.x PPMA models written from those libraries' module names, converted into mmdet 3 / mmseg 1 models."""
import argparse
import functools
import importlib
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

from mmppma.models import MLLA, PPMA, RMT, VMINet
from mmppma.models.backbones import mlla_spec
from mmppma.models.conversion import checkpoint_convert as cc
from mmppma.models.conversion.checkpoint_convert import (
    CheckpointMismatchError,
    extract_state_dict,
    mmppma_to_release,
    release_to_mmppma,
)
from mmppma.models.layers.mlla import mlla_rope_tables

from .conftest import REPO_ROOT, fixture_shapes, random_tensors, release_state

# (family, release size) -> (config arch, parameters of the release classifier with its 1000-class head)
SIZES = {
    ('PPMA', 'T'): ('tiny', 14_335_272), ('PPMA', 'S'): ('small', 26_969_472), ('PPMA', 'B'): ('base', 54_158_524),
    ('RMT', 'T'): ('tiny', None),  # no release key list: mmppma's RMT keys with the PPMA release head
    ('MLLA', 'T'): ('t', 24_392_200), ('MLLA', 'S'): ('s', 43_015_048), ('MLLA', 'B'): ('b', 95_983_960),
    ('VMINet', 'Ti'): ('ti', 2_036_938), ('VMINet', 'XS'): ('xs', 7_440_370), ('VMINet', 'S'): ('s', 13_347_442),
    ('VMINet', 'B'): ('b', 28_387_138),
}
SMALLEST = {'PPMA': ('T', 'tiny'), 'RMT': ('T', 'tiny'), 'MLLA': ('T', 't'), 'VMINet': ('Ti', 'ti')}  # size, arch
BUFFERS = ('running_mean', 'running_var', 'num_batches_tracked', 'rope.rotations', 'Relpos.angle')
HEAD = ('proj.', 'norm.', 'head.')  # the release classifiers' keys outside the backbone
ROPE = '.attn.rope.rotations'  # MLLA's fixed RoPE tables: mmppma computes RoPE per input size
# release key -> converted key: tensors carried over unchanged
CARRIED = {
    'PPMA': {'head.weight': 'head.fc.weight', 'proj.bias': 'head.proj.bias', 'norm.weight': 'head.norm.weight',
             'layers.0.Relpos.angle': 'backbone.layers.0.Relpos.angle'},
    'MLLA': {'head.weight': 'head.fc.weight', 'head.bias': 'head.fc.bias', 'norm.weight': 'backbone.norm3.weight',
             'layers.2.downsample.conv.2.norm.running_mean': 'backbone.layers.2.downsample.conv.2.norm.running_mean'},
    'VMINet': {'head.weight': 'head.fc.weight', 'head.bias': 'head.fc.bias', 'norm.weight': 'backbone.norm3.weight',
               'norm.running_var': 'backbone.norm3.running_var',
               'stages.2.7.g.bn.running_mean': 'backbone.stages.2.7.g.bn.running_mean',  # 6b11d4a only
               'stages.2.0.conv.weight': 'backbone.stages.2.0.conv.weight'},  # a downsample
}
CARRIED['RMT'] = dict(CARRIED['PPMA'], **{'layers.1.Relpos.decay': 'backbone.layers.1.Relpos.decay'})
# yws-wxs/VMINet vminet.py revisions -> the name of the blocks' depthwise ConvBN, the VMINet options reproducing
# it: 6b11d4a has a BatchNorm after g (proj_norm) and no mask; 7c2632c no BatchNorm and the lower-triangular mask
REVISIONS = {'6b11d4a': ('dwconv', dict(context_mask='none', proj_norm=True)),
             '7c2632c': ('conv', dict(context_mask='tril', proj_norm=False))}
VMINET_CASES = [(size, rev) for rev in REVISIONS for size in ('Ti', 'XS', 'S', 'B')]


def shapes_of(state: dict) -> dict:
    return {k: tuple(v.shape) for k, v in state.items()}


def family_state(family: str, size: str, random: bool = False) -> dict:
    """A release classification state dict of ``family`` from its fixture key list."""
    if family != 'RMT':
        return release_state(f'{family.lower()}_{size}', random)
    with torch.device('meta'):
        rmt = RMT('tiny', out_indices=(3, ), out_norm=False).state_dict()
    head = {k: v for k, v in release_state('ppma_T', random).items() if k.startswith(HEAD)}
    return {**{k: torch.zeros(v.shape) for k, v in rmt.items()}, **head}


def named_config(family: str, arch: str, revision: str = None) -> str:
    """The repository config for a converted classifier (VMINet: the release revision's, by default 6b11d4a)."""
    if family == 'VMINet':
        return f'configs/vminet_{arch}_release-{revision or "6b11d4a"}_in1k.py'
    return f'configs/{family.lower()}_{arch[0]}_8xb128_in1k.py'


def build(config: str, device: str = 'meta', **backbone) -> torch.nn.Module:
    """The mmpretrain model of a repository config, built with the registry."""
    cfg = Config.fromfile(str(REPO_ROOT / config)).model
    cfg.backbone.update(backbone)
    cfg.pop('train_cfg', None)
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device(device):
        return MODELS.build(cfg)


@functools.lru_cache(maxsize=None)
def config_model(config: str) -> torch.nn.Module:
    return build(config)


def config_shapes(config: str) -> dict:
    return shapes_of(config_model(config).state_dict())


def backbone_keys(config: str) -> set:
    return {k for k in config_shapes(config) if k.startswith('backbone.')}


KEY_CASES = [(f, s, None) for f, s in SIZES if f != 'VMINet'] + [('VMINet', s, rev) for s, rev in VMINET_CASES]


@pytest.mark.parametrize('family,size,revision', KEY_CASES, ids=['-'.join(filter(None, c)) for c in KEY_CASES])
def test_every_release_key_maps_with_matching_shape_and_back(family, size, revision):
    """VMINet: both release revisions, recognized, renamed, recorded and written back in the revision's layout."""
    arch, params = SIZES[family, size]
    state = vminet_state(size, revision) if revision else family_state(family, size)
    config = named_config(family, arch, revision)
    if params:  # the key list and our config have the release's parameter count (6b11d4a's for VMINet)
        release = sum(v.numel() for k, v in state.items() if not k.endswith(BUFFERS))
        assert release == sum(p.numel() for p in config_model(config).parameters())
        assert release == params or revision == '7c2632c'
    converted, info = release_to_mmppma(state, family)
    assert (info['family'], info['arch'], info['config'], info['downstream'], info['backbone_overrides']) == \
        (family, arch, config, False, {})
    if family in ('PPMA', 'RMT'):
        assert info['mask'] == {'PPMA': 'polyline', 'RMT': 'rmt'}[family]
    assert shapes_of(converted) == config_shapes(config)
    rope = [k for k in state if k.endswith(ROPE)]  # nothing dropped but MLLA's RoPE tables, nothing invented
    assert sorted(info['dropped']) == sorted(rope) and len(converted) == len(state) - len(rope)
    assert bool(rope) == (family == 'MLLA')
    assert all(converted[new] is state[old] for old, new in CARRIED[family].items() if old in state)
    if revision:
        depthwise, options = REVISIONS[revision]
        assert info['revision'] == revision
        assert info['release'] == converted._metadata['backbone']['mmppma_vminet_release'] == \
            dict(revision=revision, **options)
        backbone = Config.fromfile(str(REPO_ROOT / config)).model.backbone
        options_set = dict(arch=backbone.arch, context_mask=backbone.context_mask, proj_norm=backbone.proj_norm)
        assert options_set == dict(arch=arch, **options)
        assert converted['backbone.stages.2.3.dwconv.bn.running_mean'] is \
            state[f'stages.2.3.{depthwise}.bn.running_mean']
    back = mmppma_to_release(converted, family)  # VMINet: in the revision the converted state records
    assert shapes_of(back) == shapes_of(state)
    assert all(back[k] is state[k] for k in state if k not in rope)


# family -> (release file container, converter flags, summary-line name, a key the checkpoint must have)
CLI = {
    'PPMA': (lambda s: {'model': s, 'epoch': 300}, [], 'PPMA-tiny', 'layers.0.blocks.1.pos.conv.bias'),
    # the MLLA release file pickles its training config
    'MLLA': (lambda s: {'model': s, 'config': argparse.Namespace(tag='release')}, ['--allow-pickle'], 'MLLA-t',
             'layers.1.blocks.0.mlp.fc1.bias'),
    'VMINet': (lambda s: {'state_dict': s, 'epoch': 300}, ['--arch', 'TI'], 'VMINet-ti', 'stages.0.2.f1.conv.bias'),
}


@pytest.mark.parametrize('family', CLI)
def test_cli_output_loads_into_the_named_config(family, tmp_path, converter_main, capsys, monkeypatch):
    """Convert a random release file (``--backbone-out``, ``--backbone-only``; no config file read, the default one
    only named), then load it as documented: the backbone-only file through init_cfg Pretrained with the prefix,
    the full file strictly into the model of the printed config; a 10-class head gets a note."""
    (container, flags, name, needed), (size, arch) = CLI[family], SMALLEST[family]
    state, config = family_state(family, size, random=True), named_config(family, arch)
    torch.save(container(state), tmp_path / 'release.pth')

    def convert(dst, *extra, flags=flags):
        with monkeypatch.context() as patch:
            patch.setattr(Config, 'fromfile', lambda *args, **kwargs: pytest.fail('a config file was read'))
            return converter_main(['--family', family.lower(), str(tmp_path / 'release.pth'), str(tmp_path / dst),
                                   *flags, *extra])

    if '--allow-pickle' in flags:
        with pytest.raises(SystemExit, match='--allow-pickle'):
            convert('x.pth', flags=[])
        assert not (tmp_path / 'x.pth').exists()
    assert convert('full.pth', '--backbone-out', str(tmp_path / 'bb.pth')) == 0
    out = capsys.readouterr().out
    assert name in out and ('RoPE buffers' in out) == (family == 'MLLA')
    assert Path(re.search(r'^config: (\S+)$', out, flags=re.M).group(1)).resolve() == REPO_ROOT / config
    full = torch.load(tmp_path / 'full.pth')
    meta = full['meta']
    assert (meta['source_key'], meta['family'], meta['arch']) == (list(container(state))[0], family, arch)
    assert Path(meta['config']).resolve() == REPO_ROOT / config
    assert len(full['state_dict']) == len(state) - meta['dropped']
    assert shapes_of(full['state_dict']) == config_shapes(config)
    assert set(torch.load(tmp_path / 'bb.pth')['state_dict']) == backbone_keys(config)
    assert convert('only.pth', '--backbone-only') == 0
    assert set(torch.load(tmp_path / 'only.pth')['state_dict']) == backbone_keys(config)
    if family == 'VMINet':
        assert "backbone needs context_mask='none', proj_norm=True" in capsys.readouterr().out
    pretrained = dict(type='Pretrained', checkpoint=str(tmp_path / 'only.pth'), prefix='backbone.')
    model = build(config, device='cpu', init_cfg=pretrained)
    model.backbone.init_weights()
    loaded = model.backbone.state_dict()
    assert [k for k, v in loaded.items() if not torch.equal(v, full['state_dict'][f'backbone.{k}'])] == []
    assert torch.equal(loaded[needed], state[needed])
    result = model.load_state_dict(full['state_dict'], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(model.head.fc.weight, state['head.weight'])
    if family == 'VMINet':  # the release's blocks need the revision's options
        default = VMINet('ti', out_indices=(3, ), out_norm='BN', init_cfg=pretrained)
        with pytest.raises(ValueError, match=r"release revision 6b11d4a, whose blocks need context_mask='none'"):
            default.init_weights()
    ten = dict(state, **{'head.weight': torch.zeros(10, state['head.weight'].shape[1]), 'head.bias': torch.zeros(10)})
    torch.save(container(ten), tmp_path / 'release.pth')
    assert convert('ten.pth') == 0 and 'note: 10 classes: set model.head.num_classes=10' in capsys.readouterr().out

    del state[needed]
    torch.save(container(state), tmp_path / 'release.pth')
    with pytest.raises(SystemExit, match=rf"missing keys \['(backbone\.)?{needed}'\]"):
        convert('y.pth')
    assert not (tmp_path / 'y.pth').exists()


# family -> (an unexpected key, a missing key, (a key, a wrong shape, the message))
MISMATCH = {
    'PPMA': ('layers.1.blocks.0.retention.bias_table', 'layers.2.blocks.3.ffn.fc2.bias',
             ('layers.0.blocks.0.retention.path_embed.A_log', (5, ), r'checkpoint \(5,\) vs model \(4,\)')),
    'MLLA': ('layers.1.blocks.0.attn.bias_table', 'layers.2.blocks.3.mlp.fc2.bias',
             ('layers.0.blocks.1.attn.qk.bias', (64, ), r'checkpoint \(64,\) vs model \(128,\)')),
    'VMINet': ('stages.1.2.f3.conv.weight', 'stages.2.17.g.bn.running_var',
               ('stages.1.2.sum.weight', (1, 700), r'checkpoint \(1, 700\) vs model \(1, 784\)')),
}


@pytest.mark.parametrize('family', MISMATCH)
def test_mismatches_are_errors_listing_the_keys(family):
    extra, missing, (key, shape, message) = MISMATCH[family]
    size, arch = SMALLEST[family]
    state = family_state(family, size)
    prefix = r'backbone\.'
    with pytest.raises(CheckpointMismatchError, match=rf"1 unexpected keys \['{prefix}{extra}'\]"):
        release_to_mmppma(dict(state, **{extra: torch.zeros(3)}), family)
    with pytest.raises(CheckpointMismatchError, match=rf"1 missing keys \['{prefix}{missing}'\]"):
        release_to_mmppma({k: v for k, v in state.items() if k != missing}, family)
    with pytest.raises(CheckpointMismatchError, match=message):
        release_to_mmppma(dict(state, **{key: torch.zeros(shape)}), family)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys? \[?'dist_token'"):
        release_to_mmppma(dict(state, dist_token=torch.zeros(1)), family)
    headless = {k: v for k, v in state.items() if not k.startswith('head.')}
    with pytest.raises(CheckpointMismatchError, match='without head'):
        release_to_mmppma(headless, family)
    assert set(release_to_mmppma(headless, family, backbone_only=True)[0]) == backbone_keys(named_config(family, arch))


# family -> (dense output norms' name, stage widths, the dense backbone's output norm)
DENSE = {'PPMA': ('outnorm', (64, 128, 256, 512), dict(out_norm=True)),
         'MLLA': ('norm', (64, 128, 256, 512), dict(out_norm=True)),
         'VMINet': ('outnorm', (24, 48, 96, 192), dict(out_norm='LN'))}


@pytest.mark.parametrize('family', DENSE)
def test_downstream_checkpoints(family):
    """A dense backbone (MLLA: ``norm0-3``, RoPE buffers) under ``backbone.`` beside passed-through model keys."""
    norm, widths, out_norm = DENSE[family]
    size, arch = SMALLEST[family]
    backbone = {k: v for k, v in family_state(family, size).items() if not k.startswith(HEAD)}
    for i, c in enumerate(widths):
        backbone[f'{norm}{i}.weight'], backbone[f'{norm}{i}.bias'] = torch.ones(c), torch.zeros(c)
    others = {'neck.lateral_convs.0.conv.weight': torch.zeros(256, 64, 1, 1),
              'decode_head.conv_seg.weight': torch.zeros(150, 512, 1, 1)}
    state = {**{f'backbone.{k}': v for k, v in backbone.items()}, **others}
    full, info = release_to_mmppma(state, family)
    assert (info['downstream'], info['out_indices'], info['arch'], info['passthrough']) == \
        (True, (0, 1, 2, 3), arch, sorted(others))
    rope = {k for k in state if k.endswith(ROPE)}
    assert set(full) == set(state) - rope
    only, _ = release_to_mmppma(state, family, backbone_only=True)
    with torch.device('meta'):
        dense = {'PPMA': PPMA, 'MLLA': MLLA, 'VMINet': VMINet}[family](arch, out_indices=(0, 1, 2, 3), **out_norm)
    assert shapes_of({k[len('backbone.'):]: v for k, v in only.items()}) == shapes_of(dense.state_dict())
    back = mmppma_to_release(full, family, downstream=True)
    assert shapes_of(back) == shapes_of(state) and all(back[k] is state[k] for k in state if k not in rope)
    del state[f'backbone.{norm}2.bias']
    with pytest.raises(CheckpointMismatchError, match=rf"missing keys \['(backbone\.)?{norm}2.bias'\]"):
        release_to_mmppma(state, family)


def test_family_arch_and_layout_errors(tmp_path, converter_main):
    assert cc.check_family('rmt') == 'PPMA' and cc.check_family('vminet') == 'VMINet'
    with pytest.raises(ValueError, match=r'choose one of MLLA, PPMA, VMINet \(or a variant: PPMLA, RMT\)'):
        release_to_mmppma({}, 'ResNet')
    mlla, vminet = family_state('MLLA', 'T'), family_state('VMINet', 'Ti')
    torch.save({'model': vminet}, tmp_path / 'release.pth')
    with pytest.raises(SystemExit, match="arch='xl' is not a VMINet arch"):
        converter_main(['--family', 'VMINet', '--arch', 'xl', str(tmp_path / 'release.pth'), str(tmp_path / 'o.pth')])
    for argv in (['--family', 'resnet'], ['--family', 'MLLA', '--arch-json', '{}']):  # argparse errors
        with pytest.raises(SystemExit):
            converter_main([*argv, 'a.pth', 'b.pth'])
    for family, other in (('PPMA', vminet), ('MLLA', vminet), ('VMINet', mlla)):
        with pytest.raises(CheckpointMismatchError, match=f'not an? {family} backbone'):
            release_to_mmppma(other, family)
    # named archs by any of their names; a checkpoint of another size or depth is an error
    assert release_to_mmppma(mlla, 'MLLA', arch='tiny')[1]['arch'] == 't'
    with pytest.raises(CheckpointMismatchError, match='missing keys'):
        release_to_mmppma(mlla, 'MLLA', arch='s')
    shallow = {k: v for k, v in mlla.items() if not k.startswith('layers.2.blocks.7.')}
    with pytest.raises(CheckpointMismatchError, match=r'depths=\[2, 4, 7, 4\].*matches no named arch'):
        release_to_mmppma(shallow, 'MLLA')
    with pytest.raises(CheckpointMismatchError, match=r'rope.rotations: RoPE table of shape \(56, 56, 64, 2\)'):
        release_to_mmppma(dict(mlla, **{'layers.0.blocks.0.attn.rope.rotations': torch.zeros(56, 56, 64, 2)}), 'MLLA')
    # PPMA: the shared mask is recognized; a custom arch is given as settings
    settings = dict(PPMA.arch_zoo['tiny'], depths=[1, 1, 1, 1])
    with torch.device('meta'):
        shared = PPMA(settings, mask='shared', out_indices=(3, ), out_norm=False).state_dict()
    shared = {k: torch.zeros(v.shape) for k, v in shared.items()}
    with pytest.raises(CheckpointMismatchError, match='matches no named arch.*with attn_types'):
        release_to_mmppma(shared, 'PPMA', backbone_only=True)
    assert release_to_mmppma(shared, 'PPMA', backbone_only=True, arch=settings)[1]['mask'] == 'shared'


def test_state_containers():
    state, ema = {'a': torch.zeros(1)}, {'b': torch.ones(1)}
    for key in ('model', 'model_ema', 'models', 'state_dict'):
        assert extract_state_dict({key: state, 'state_dict_ema': ema, 'epoch': 3}) == (state, key)
    assert extract_state_dict({'model': state, 'model_ema': ema}, key='model_ema') == (ema, 'model_ema')
    assert extract_state_dict({'state_dict_ema': ema, 'epoch': 3}) == (ema, 'state_dict_ema')
    assert extract_state_dict(state) == (state, '')
    assert extract_state_dict({'state_dict': {'module.a': state['a']}}) == (state, 'state_dict')
    with pytest.raises(KeyError, match='model, model_ema, models, state_dict'):
        extract_state_dict({'optimizer': {}, 'epoch': 1})


def test_mlla_rope_tables_are_the_release_buffers_and_our_rope():
    """The release buffer follows the release formula and is the RoPE our MLLA computes: dropping it loses nothing."""
    h, w, dim = 7, 5, 16
    rot = mlla_spec.rope_rotations(h, w, dim).double()
    assert rot.shape == (h, w, dim // 2, 2)
    quarter = dim // 4
    for i, j, m in [(0, 0, 0), (3, 4, 1), (6, 2, 3), (5, 1, 4), (2, 4, 7)]:
        angle = (i if m < quarter else j) * 10000.0**(-(m % quarter) / quarter)
        assert rot[i, j, m].tolist() == pytest.approx([math.cos(angle), math.sin(angle)], abs=1e-6)
    sin, cos = mlla_rope_tables(h, w, dim)
    torch.testing.assert_close(rot[..., 0].float(), cos[..., 0::2], atol=1e-6, rtol=0)
    torch.testing.assert_close(rot[..., 1].float(), sin[..., 0::2], atol=1e-6, rtol=0)


# ---------------------------------------------------------------- VMINet's two release revisions
def release_value(key: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Random weights and BatchNorm statistics far from the identity, scaled so 24 residual blocks stay in range."""
    name = key.rsplit('.', 1)[-1]
    if name == 'num_batches_tracked':
        return torch.tensor(1000)
    if name == 'stack' or (name == 'weight' and len(shape) == 1):
        return torch.rand(shape, generator=gen) + 0.5
    if name == 'running_var':
        return torch.rand(shape, generator=gen) * 1.5 + 0.5
    if name in ('bias', 'running_mean'):
        scale = 0.3 if name == 'running_mean' else 0.2 if '.bn.' in key or key.startswith('norm.') else 0.1
        return torch.randn(shape, generator=gen) * scale
    if key.endswith('sum.weight'):
        return torch.randn(shape, generator=gen) * 0.02
    scale = math.prod(shape[1:])**-0.5 * (0.3 if key.endswith('.g.conv.weight') else 1)
    return torch.randn(shape, generator=gen) * scale


def vminet_state(size: str, revision: str, seed=None) -> dict:
    """A VMINet release classifier in ``revision``'s layout (7c2632c: depthwise ConvBN ``conv``, no ``g.bn``): empty,
    or :func:`release_value` from ``seed``."""
    (depthwise, opts), gen, state = REVISIONS[revision], torch.Generator().manual_seed(seed or 0), {}
    for key, shape in fixture_shapes(f'vminet_{size}').items():
        if opts['proj_norm'] or '.g.bn.' not in key:
            key = key.replace('.dwconv.', f'.{depthwise}.')
            state[key] = torch.empty(shape) if seed is None else release_value(key, shape, gen)
    return state


def release_logits(state: dict, revision: str, x: torch.Tensor, tril: bool = None) -> torch.Tensor:
    """The release classifier's eval forward (x: (B, 3, 224, 224)); ``tril`` overrides the revision's mask. Per
    block: u = BN(dwconv(x)); y = relu6(f1(u)) f2(u); s_c = sum_n w_n y[c, n] (the mask keeps n >= c);
    out = x + g(relu6(stack_0 s + stack_1 y))."""
    depthwise, g_bn = REVISIONS[revision][0], REVISIONS[revision][1]['proj_norm']
    tril = REVISIONS[revision][1]['context_mask'] == 'tril' if tril is None else tril
    st = {k: v.to(x.dtype) if v.is_floating_point() else v for k, v in state.items()}

    def conv(key, x, stride=1, groups=1):
        w = st[key + '.weight']
        return F.conv2d(x, w, st[key + '.bias'], stride, w.shape[-1] // 2, 1, groups)

    def bn(key, x):
        return F.batch_norm(x, st[key + '.running_mean'], st[key + '.running_var'], st[key + '.weight'],
                            st[key + '.bias'], False, 0.0, 1e-5)

    x = F.relu6(bn('stem.0.bn', conv('stem.0.conv', x, 2)))
    for i, depth in enumerate((2, 2, 18, 2)):
        x = bn(f'stages.{i}.0.bn', conv(f'stages.{i}.0.conv', x, 2))
        for j in range(1, depth + 1):
            p = f'stages.{i}.{j}.'
            u = bn(p + depthwise + '.bn', conv(p + depthwise + '.conv', x, groups=x.shape[1]))
            y = F.relu6(conv(p + 'f1.conv', u)) * conv(p + 'f2.conv', u)
            tokens = y.flatten(2)
            if tril:
                tokens = tokens * (torch.arange(tokens.shape[2])[None, :] >= torch.arange(tokens.shape[1])[:, None])
            s = torch.einsum('bcn,n->bc', tokens, st[p + 'sum.weight'][0])
            z = F.relu6(st[p + 'stack'][0] * s[:, :, None, None] + st[p + 'stack'][1] * y)
            out = conv(p + 'g.conv', z)
            x = x + (bn(p + 'g.bn', out) if g_bn else out)
    return F.linear(bn('norm', x).mean((2, 3)), st['head.weight'], st['head.bias'])


def rel_max_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


# revision -> (a config with other options, the error)
WRONG_CONFIGS = {
    '6b11d4a': [('vminet_ti_8xb128_in1k.py', r"need context_mask='none'; this backbone has context_mask='tril'"),
                ('vminet_ti_release-7c2632c_in1k.py', r"need context_mask='none', proj_norm=True")],
    '7c2632c': [('vminet_ti_8xb128_in1k.py', r'need proj_norm=False; this backbone has proj_norm=True'),
                ('vminet_ti_release-6b11d4a_in1k.py', r"need context_mask='tril', proj_norm=False")],
}


@pytest.mark.parametrize('size,revision', [
    pytest.param(size, rev, marks=() if size == 'Ti' else pytest.mark.heavy) for size, rev in VMINET_CASES])
def test_converted_vminet_release_gives_release_logits(size, revision, tmp_path, converter_main, capsys):
    """Convert, then init_model with the printed config: the release's logits; other options' configs refuse it."""
    from mmpretrain.apis import init_model
    state, dst = vminet_state(size, revision, seed=1), tmp_path / 'converted.pth'
    torch.save({'state_dict': state, 'epoch': 300}, tmp_path / 'release.pth.tar')
    assert converter_main(['--family', 'VMINet', str(tmp_path / 'release.pth.tar'), str(dst)]) == 0
    out = capsys.readouterr().out
    configs = [Path(c).resolve() for c in re.findall(r'^config: (\S+)$', out, flags=re.M)]
    assert configs == [REPO_ROOT / named_config('VMINet', SIZES['VMINet', size][0], revision)], out
    assert f'release revision {revision}' in out
    assert torch.load(dst)['meta']['mmppma_vminet_release']['revision'] == revision
    model = init_model(str(configs[0]), str(dst), device='cpu')
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(x, mode='tensor')
    ref = release_logits(state, revision, x)  # float32: ~1e-7 relative rounding here, far below the tolerance
    assert ref.abs().max() > 1 and ref.std() > 0.1  # logits far from degenerate
    assert rel_max_error(logits, ref) < 1e-4
    if size == 'Ti':  # the other revision's mask is far outside the tolerance
        other_mask = REVISIONS[revision][1]['context_mask'] != 'tril'
        assert rel_max_error(release_logits(state, revision, x, tril=other_mask), ref) > 1e-3
        for wrong, message in WRONG_CONFIGS[revision]:
            with pytest.raises(ValueError, match=message + r'.*release-' + revision):
                init_model(str(REPO_ROOT / 'configs' / wrong), str(dst), device='cpu')


def test_vminet_options_the_weights_contradict_are_errors():
    """Without the record (a plain dict) the keys still tell proj_norm; an unconverted state names the
    converter; the converter refuses a config or a layout that fits neither revision."""
    def plain_backbone(revision):
        converted = release_to_mmppma(vminet_state('Ti', revision), 'VMINet', backbone_only=True)[0]
        return {k[len('backbone.'):]: v for k, v in converted.items()}

    with pytest.raises(ValueError, match=r'no stages\.\*\.g\.bn\.\* keys.*Set proj_norm=False'):
        VMINet('ti', out_indices=(3, ), out_norm='BN').load_state_dict(plain_backbone('7c2632c'), strict=False)
    with pytest.raises(ValueError, match=r'has stages\.\*\.g\.bn\.\* keys.*Set proj_norm=True'):
        VMINet('ti', out_indices=(3, ), out_norm='BN', proj_norm=False).load_state_dict(plain_backbone('6b11d4a'),
                                                                                          strict=False)
    raw = {k: v for k, v in vminet_state('Ti', '7c2632c').items() if k.startswith(('stem.', 'stages.'))}
    with pytest.raises(ValueError, match='unconverted VMINet release state dict.*release_to_mmppma.py --family VMINet'):
        VMINet('ti', out_indices=(3, ), out_norm=None, proj_norm=False).load_state_dict(raw)
    state = vminet_state('Ti', '6b11d4a')
    with pytest.raises(CheckpointMismatchError, match=r"model.backbone has context_mask='tril'; the release revision "
                       r"6b11d4a needs context_mask='none'"):
        release_to_mmppma(state, 'VMINet', config=REPO_ROOT / 'configs' / 'vminet_ti_8xb128_in1k.py')
    mixed = {k: v for k, v in state.items() if '.g.bn.' not in k}  # dwconv without g.bn
    with pytest.raises(CheckpointMismatchError, match="neither release revision's layout"):
        release_to_mmppma(mixed, 'VMINet')


def test_readme_finetune_walkthrough(tmp_path, run_python):
    """README "Fine-tune from release weights": its converter command (in a process of its own), then its mmdet
    config and the repository's UPerNet config initialize the backbone with the release tensors."""
    text = (REPO_ROOT / 'README.md').read_text()
    section = text[text.index('### Fine-tune from release weights'):]
    argv = shlex.split(re.search(r'```bash\n(.*?)```', section, re.S).group(1).replace('\\\n', ' '))
    config_text = re.search(r'```python\n(.*?)```', section, re.S).group(1)
    assert argv[:4] == ['.venv/bin/python', 'tools/model_converters/release_to_mmppma.py', '--family', 'PPMA'], argv
    state, release, path = release_state('ppma_T', random=True), tmp_path / 'release.pth', tmp_path / 'backbone.pth'
    torch.save({'model': state}, release)
    run_python([*argv[1:4], *(str(release) if a == 'ppma_t_release.pth' else str(path) if a.endswith('backbone.pth')
                           else a for a in argv[4:])])
    written = torch.load(path)['state_dict']
    assert written and all(k.startswith('backbone.') for k in written)  # --backbone-only
    assert "checkpoint='checkpoints/ppma_t_backbone.pth'" in config_text
    mask_rcnn = Config.fromstring(config_text.replace('checkpoints/ppma_t_backbone.pth', str(path)), file_format='.py')
    upernet = Config.fromfile(str(REPO_ROOT / 'configs' / 'upernet_ppma_t_512x512_160k_ade20k.py'))
    assert upernet.model.backbone.init_cfg.type == 'Pretrained'
    upernet.merge_from_dict({'model.backbone.init_cfg.checkpoint': str(path)})
    for scope, cfg in (('mmdet', mask_rcnn), ('mmseg', upernet)):
        with DefaultScope.overwrite_default_scope(scope):
            model = importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model)
        key = 'layers.2.blocks.7.retention.path_embed.A_log'
        assert not torch.equal(model.backbone.state_dict()[key], state[key])  # built with its own init
        model.init_weights()
        got = model.backbone.state_dict()
        assert [k for k in state if not k.startswith(HEAD) and not torch.equal(got[k], state[k])] == []


# ---------------------------------------------------------------- whole release detectors and segmentors
DIMS = (64, 128, 256, 512)  # PPMA-T
COCO_CLASSES, ADE_CLASSES = 80, 150


def backbone_shapes() -> dict:
    """The release's dense PPMA-T backbone: its classification keys without the head, and LayerNorm outnorm{i}."""
    shapes = {f'backbone.{k}': v for k, v in fixture_shapes('ppma_T').items() if not k.startswith(HEAD)}
    return {**shapes, **{f'backbone.outnorm{i}.{p}': (d, ) for i, d in enumerate(DIMS) for p in ('weight', 'bias')}}


def layer_shapes(layers) -> dict:
    """(name, out, in, kernel (0: Linear)[, True]) rows -> keys and shapes: a layer with its bias, or with True mmcv's
    ConvModule (``conv`` without bias, ``bn`` with its statistics)."""
    shapes = {}
    for name, out, inp, k, *bn in layers:
        weight = (out, inp, k, k) if k else (out, inp)
        if bn:
            shapes.update({f'{name}.conv.weight': weight, f'{name}.bn.num_batches_tracked': ()})
            shapes.update({f'{name}.bn.{p}': (out, ) for p in ('weight', 'bias', 'running_mean', 'running_var')})
        else:
            shapes.update({f'{name}.weight': weight, f'{name}.bias': (out, )})
    return shapes


# mmdet 2.x mask_rcnn_r50_fpn: FPN (256, 5 outs), RPNHead (3 anchors), Shared2FCBBoxHead, FCNMaskHead (4 convs)
MASK_RCNN_HEADS = [
    *((f'neck.lateral_convs.{i}.conv', 256, d, 1) for i, d in enumerate(DIMS)),
    *((f'neck.fpn_convs.{i}.conv', 256, 256, 3) for i in range(4)),
    ('rpn_head.rpn_conv', 256, 256, 3), ('rpn_head.rpn_cls', 3, 256, 1),
    ('rpn_head.rpn_reg', 12, 256, 1), ('roi_head.bbox_head.fc_cls', COCO_CLASSES + 1, 1024, 0),
    ('roi_head.bbox_head.fc_reg', 4 * COCO_CLASSES, 1024, 0),
    ('roi_head.bbox_head.shared_fcs.0', 1024, 256 * 7 * 7, 0),
    ('roi_head.bbox_head.shared_fcs.1', 1024, 1024, 0),
    *((f'roi_head.mask_head.convs.{i}.conv', 256, 256, 3) for i in range(4)),
    ('roi_head.mask_head.upsample', 256, 256, 2), ('roi_head.mask_head.conv_logits', COCO_CLASSES, 256, 1)]
# mmseg 0.x upernet_r50: UPerHead (512 channels, pool scales 1, 2, 3, 6; SyncBN), FCNHead on stage 2 (256, one conv)
UPERNET_HEADS = [
    ('decode_head.conv_seg', ADE_CLASSES, 512, 1),
    *((f'decode_head.psp_modules.{j}.1', 512, DIMS[-1], 1, True) for j in range(4)),
    ('decode_head.bottleneck', 512, DIMS[-1] + 4 * 512, 3, True),
    *((f'decode_head.lateral_convs.{i}', 512, d, 1, True) for i, d in enumerate(DIMS[:-1])),
    *((f'decode_head.fpn_convs.{i}', 512, 512, 3, True) for i in range(3)),
    ('decode_head.fpn_bottleneck', 512, 4 * 512, 3, True), ('auxiliary_head.convs.0', 256, DIMS[2], 3, True),
    ('auxiliary_head.conv_seg', ADE_CLASSES, 256, 1)]

TASKS = {
    'det': dict(library='mmdet.models', config='configs/mask_rcnn_ppma_t_1x_coco.py', heads=MASK_RCNN_HEADS,
                meta=dict(CLASSES=tuple(f'class{i}' for i in range(COCO_CLASSES)), mmdet_version='2.28.2')),
    'seg': dict(library='mmseg.models', config='configs/upernet_ppma_t_512x512_160k_ade20k.py', heads=UPERNET_HEADS,
                meta=dict(CLASSES=tuple(f'class{i}' for i in range(ADE_CLASSES)),
                          PALETTE=[[i, i, i] for i in range(ADE_CLASSES)], mmseg_version='0.30.0')),
}


def release_checkpoint(task: str) -> dict:
    state = random_tensors({**backbone_shapes(), **layer_shapes(TASKS[task]['heads'])}, scale=0.05)
    return dict(meta=dict(TASKS[task]['meta']), state_dict=state, optimizer={})


@pytest.fixture(params=list(TASKS))
def task(request) -> str:
    pytest.importorskip(TASKS[request.param]['library'])
    return request.param


def test_whole_release_model_converts_loads_strictly_and_names_wrong_keys(task, tmp_path, converter_main):
    """The command line: every key of the release file in the config's model, loaded strictly into the model mmdet 3
    / mmseg 1 build, each tensor the release's; a missing (det) or unexpected (seg) head key is named."""
    from mmppma.models.conversion.whole_model_convert import convert_whole_release
    from mmppma.utils.configs import build_config_model
    release, config = release_checkpoint(task), str(REPO_ROOT / TASKS[task]['config'])
    src, dst = tmp_path / 'release.pth', tmp_path / 'converted.pth'
    torch.save(release, src)
    assert converter_main(['--family', 'PPMA', str(src), str(dst), '--model-config', config]) == 0
    converted = torch.load(dst, map_location='cpu', weights_only=True)
    model = build_config_model(config, device='cpu')
    model.load_state_dict(converted['state_dict'], strict=True)
    got, state = model.state_dict(), release['state_dict']
    assert set(got) == set(state) and [k for k, v in state.items() if not torch.equal(got[k], v)] == []
    assert converted['meta']['dataset_meta']['classes'] == list(TASKS[task]['meta']['CLASSES'])
    key = sorted(k for k in state if not k.startswith('backbone.'))[0]
    if task == 'det':
        del state[key]
    else:
        key = key.rsplit('.', 1)[0] + '.extra'
        state[key] = torch.zeros(1)
    edit = {'det': 'missing', 'seg': 'unexpected'}[task]
    with pytest.raises(CheckpointMismatchError, match=f'1 {edit} keys .*{key.replace(".", "[.]")}'):
        convert_whole_release(release, 'PPMA', config)
