"""VMINet release checkpoints of both release revisions give the release's logits through the documented steps
(convert with tools/model_converters/vminet_official_to_mmppma.py, load with the printed config), and loading
into a backbone with other options is an error naming the option.

The reference is written here from the structure of the release's ``vminet.py`` (yws-wxs/VMINet), not from
mmppma's modules: a random state dict in the release's key layout and a functional forward over it.
"""
import math
import re
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('mmpretrain.models')

from mmppma.models import VMINet  # noqa: E402
from mmppma.models.utils.checkpoint_convert import CheckpointMismatchError, release_to_mmppma  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / 'fixtures'

# ---------------------------------------------------------------- the release, as an independent reference
# Every size: a stem (3x3 stride-2 conv + BatchNorm -> 32 channels, ReLU6), four stages of widths base * 2^i,
# each a 3x3 stride-2 conv + BatchNorm then 2 / 2 / 18 / 2 blocks; BatchNorm, global average pool and a Linear.
# (base width, expansion r) of vminet_{Ti,XS,S,B}; the test's fixture files name the sizes Ti / XS / S / B.
SIZES = {'ti': (24, 2, 'Ti'), 'xs': (48, 2, 'XS'), 's': (48, 4, 'S'), 'b': (96, 2, 'B')}
DEPTHS = (2, 2, 18, 2)
STEM = 32
GRIDS = (56, 28, 14, 7)  # token grid side per stage at 224 x 224: the length of each block's token weights
# A block (input x, C channels): u = BN(depthwise 7x7 conv(x)); y = relu6(f1(u)) * f2(u) with f1, f2 1x1 convs
# C -> rC; a context vector s_c = sum over tokens n of w_n y[c, n] (w: 'sum', one learned weight per token);
# z = relu6(stack_0 s + stack_1 y); out = x + g(z) with g a 1x1 conv rC -> C. The two revisions:
REVISIONS = {
    # name of the depthwise ConvBN, BatchNorm after g, lower-triangular mask (channel c sums tokens n >= c only)
    '6b11d4a': dict(depthwise='dwconv', g_bn=True, tril=False),
    '7c2632c': dict(depthwise='conv', g_bn=False, tril=True),
}
CASES = [(size, rev) for rev in REVISIONS for size in SIZES]
FAST = {('ti', '6b11d4a'), ('ti', '7c2632c')}


def release_shapes(size: str, revision: str) -> 'OrderedDict[str, tuple]':
    """The keys and shapes of a release classifier's state dict (1000 classes) in the revision's layout."""
    base, r, _ = SIZES[size]
    rev = REVISIONS[revision]
    shapes = OrderedDict()

    def conv(key, c_out, c_in, k):
        shapes.update({key + '.weight': (c_out, c_in, k, k), key + '.bias': (c_out, )})

    def bn(key, c):
        shapes.update({f'{key}.{name}': (c, ) for name in ('weight', 'bias', 'running_mean', 'running_var')})
        shapes[key + '.num_batches_tracked'] = ()

    conv('stem.0.conv', STEM, 3, 3)
    bn('stem.0.bn', STEM)
    c_in = STEM
    for i, depth in enumerate(DEPTHS):
        c = base * 2**i
        conv(f'stages.{i}.0.conv', c, c_in, 3)
        bn(f'stages.{i}.0.bn', c)
        for j in range(1, depth + 1):
            p = f'stages.{i}.{j}.'
            shapes[p + 'stack'] = (2, )
            conv(p + rev['depthwise'] + '.conv', c, 1, 7)
            bn(p + rev['depthwise'] + '.bn', c)
            conv(p + 'f1.conv', r * c, c, 1)
            conv(p + 'f2.conv', r * c, c, 1)
            shapes[p + 'sum.weight'] = (1, GRIDS[i]**2)
            conv(p + 'g.conv', c, r * c, 1)
            if rev['g_bn']:
                bn(p + 'g.bn', c)
        c_in = c
    bn('norm', c_in)
    shapes.update({'head.weight': (1000, c_in), 'head.bias': (1000, )})
    return shapes


def release_state(size: str, revision: str, seed: int = 0) -> 'OrderedDict[str, torch.Tensor]':
    """:func:`release_shapes` filled with random weights and BatchNorm statistics far from the identity: convs
    and the head ~ N(0, 1 / fan_in) (``g`` 0.3 of that, so that 24 residual blocks stay in range), biases
    N(0, 0.1^2), token weights N(0, 0.02^2), ``stack`` and BatchNorm scales U(0.5, 1.5), BatchNorm shifts
    N(0, 0.2^2), running means N(0, 0.3^2), running variances U(0.5, 2)."""
    gen = torch.Generator().manual_seed(seed)
    state = OrderedDict()
    for key, shape in release_shapes(size, revision).items():
        name = key.rsplit('.', 1)[-1]
        if name == 'num_batches_tracked':
            value = torch.tensor(1000)
        elif name == 'stack' or (name == 'weight' and len(shape) == 1):
            value = torch.rand(shape, generator=gen) + 0.5
        elif name == 'running_var':
            value = torch.rand(shape, generator=gen) * 1.5 + 0.5
        elif name in ('bias', 'running_mean'):
            scale = {'running_mean': 0.3}.get(name, 0.2 if '.bn.' in key or key.startswith('norm.') else 0.1)
            value = torch.randn(shape, generator=gen) * scale
        elif key.endswith('sum.weight'):
            value = torch.randn(shape, generator=gen) * 0.02
        else:  # conv / head weights
            fan_in = math.prod(shape[1:])
            value = torch.randn(shape, generator=gen) * fan_in**-0.5 * (0.3 if key.endswith('.g.conv.weight') else 1)
        state[key] = value
    return state


def empty_state(size: str, revision: str) -> dict:
    return {k: torch.empty(shape) for k, shape in release_shapes(size, revision).items()}


def release_logits(state: dict, revision: str, x: torch.Tensor, tril: Optional[bool] = None) -> torch.Tensor:
    """The release classifier's forward over ``state`` (eval mode), in x's dtype. x: (B, 3, 224, 224).
    ``tril`` overrides the revision's mask (to show that the comparison sees it)."""
    rev = dict(REVISIONS[revision], **({} if tril is None else {'tril': tril}))
    st = {k: v.to(x.dtype) if v.is_floating_point() else v for k, v in state.items()}

    def conv(key, x, stride=1, groups=1):
        w = st[key + '.weight']
        return F.conv2d(x, w, st[key + '.bias'], stride, w.shape[-1] // 2, 1, groups)

    def bn(key, x):
        return F.batch_norm(x, st[key + '.running_mean'], st[key + '.running_var'], st[key + '.weight'],
                            st[key + '.bias'], False, 0.0, 1e-5)

    x = F.relu6(bn('stem.0.bn', conv('stem.0.conv', x, 2)))
    for i, depth in enumerate(DEPTHS):
        x = bn(f'stages.{i}.0.bn', conv(f'stages.{i}.0.conv', x, 2))
        for j in range(1, depth + 1):
            p = f'stages.{i}.{j}.'
            u = bn(p + rev['depthwise'] + '.bn', conv(p + rev['depthwise'] + '.conv', x, groups=x.shape[1]))
            y = F.relu6(conv(p + 'f1.conv', u)) * conv(p + 'f2.conv', u)
            b, c, h, w = y.shape
            tokens = y.reshape(b, c, h * w)
            if rev['tril']:
                keep = torch.arange(h * w)[None, :] >= torch.arange(c)[:, None]  # (C, N): token n >= channel c
                tokens = tokens * keep
            s = torch.einsum('bcn,n->bc', tokens, st[p + 'sum.weight'][0])
            z = F.relu6(st[p + 'stack'][0] * s[:, :, None, None] + st[p + 'stack'][1] * y)
            out = conv(p + 'g.conv', z)
            x = x + (bn(p + 'g.bn', out) if rev['g_bn'] else out)
    x = bn('norm', x).mean((2, 3))
    return F.linear(x, st['head.weight'], st['head.bias'])


def rel_max_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


# ---------------------------------------------------------------- helpers
def convert(cli_main, capsys, state, tmp_path, *flags):
    src, dst = tmp_path / 'release.pth.tar', tmp_path / 'converted.pth'
    torch.save({'state_dict': state, 'epoch': 300}, src)
    assert cli_main('VMINet', '', [str(src), str(dst), *flags]) == 0
    out = capsys.readouterr().out
    configs = re.findall(r'^config: (\S+)$', out, flags=re.M)
    assert len(configs) == 1, out
    return dst, Path(configs[0]).resolve(), out


def release_config_name(size: str, revision: str) -> str:
    return f'vminet_{size}_release-{revision}_in1k.py'


def fixture_shapes(letter: str) -> dict:
    shapes = {}
    for line in (FIXTURES / f'official_vminet_{letter}_keys.txt').read_text().splitlines():
        key, shape = line.split(' ', 1)
        shapes[key] = tuple(int(s) for s in shape.strip('()').split(',') if s.strip())
    return shapes


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize('size', SIZES)
def test_reference_layout_is_the_release_key_list(size):
    """The reference's 6b11d4a layout is the release key list of tests/fixtures; 7c2632c renames the depthwise
    ConvBN and drops g.bn."""
    shapes = dict(release_shapes(size, '6b11d4a'))
    assert shapes == fixture_shapes(SIZES[size][2])
    old = dict(release_shapes(size, '7c2632c'))
    assert old == {k.replace('.dwconv.', '.conv.'): v for k, v in shapes.items() if '.g.bn.' not in k}


@pytest.mark.parametrize('size,revision', CASES)
def test_converter_names_the_revision_config_for_every_size(size, revision):
    converted, info = release_to_mmppma(empty_state(size, revision), 'VMINet')
    assert info['arch'] == size and REPO / info['config'] == REPO / 'configs' / release_config_name(size, revision)
    assert info['release'] == dict(revision=revision, context_mask='tril' if REVISIONS[revision]['tril'] else 'none',
                                   proj_norm=REVISIONS[revision]['g_bn'])
    assert converted._metadata['backbone']['mmppma_vminet_release'] == info['release']
    from mmengine.config import Config
    backbone = Config.fromfile(str(REPO / info['config'])).model.backbone
    release = info['release']
    assert (backbone.arch, backbone.context_mask, backbone.proj_norm) == \
        (size, release['context_mask'], release['proj_norm'])


@pytest.mark.parametrize('size,revision', [
    pytest.param(size, rev, marks=() if (size, rev) in FAST else pytest.mark.slow) for size, rev in CASES])
def test_converted_release_gives_release_logits(size, revision, tmp_path, cli_main, capsys):
    """Step 1: the converter; step 2: mmpretrain's init_model with the config it prints."""
    from mmpretrain.apis import init_model
    state = release_state(size, revision, seed=1)
    dst, config, out = convert(cli_main, capsys, state, tmp_path)
    assert config == REPO / 'configs' / release_config_name(size, revision)
    assert f'release revision {revision}' in out
    assert torch.load(dst)['meta']['mmppma_vminet_release']['revision'] == revision
    model = init_model(str(config), str(dst), device='cpu')
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(x, mode='tensor')
    # float64 for Ti; the larger sizes against the release's own float32 (a float64 forward of B takes minutes
    # on a CPU; float32 rounding is ~1e-7 relative here, three orders below the tolerance)
    ref = release_logits(state, revision, x.double() if size == 'ti' else x)
    assert ref.abs().max() > 1 and ref.std() > 0.1  # logits far from degenerate
    err = rel_max_error(logits, ref)
    print(f'VMINet-{size} revision {revision}: relative max logit error {err:.2e}')
    assert err < 1e-4
    if size == 'ti':  # the other revision's mask is far outside the tolerance
        assert rel_max_error(release_logits(state, revision, x, tril=not REVISIONS[revision]['tril']), ref) > 1e-3


@pytest.mark.parametrize('revision,wrong_config,message', [
    ('6b11d4a', 'vminet_ti_8xb128_in1k.py', r"need context_mask='none'; this backbone has context_mask='tril'"),
    ('7c2632c', 'vminet_ti_8xb128_in1k.py', r"need proj_norm=False; this backbone has proj_norm=True"),
    ('7c2632c', 'vminet_ti_release-6b11d4a_in1k.py', r"need context_mask='tril', proj_norm=False"),
    ('6b11d4a', 'vminet_ti_release-7c2632c_in1k.py', r"need context_mask='none', proj_norm=True"),
])
def test_loading_into_other_options_is_an_error(revision, wrong_config, message, tmp_path, cli_main, capsys):
    from mmpretrain.apis import init_model
    dst, _, _ = convert(cli_main, capsys, release_state('ti', revision), tmp_path)
    with pytest.raises(ValueError, match=message + r'.*release-' + revision):
        init_model(str(REPO / 'configs' / wrong_config), str(dst), device='cpu')


def test_backbone_only_through_init_cfg(tmp_path, cli_main, capsys):
    """--backbone-only: init_cfg Pretrained with a prefix (mmengine drops the state dict's load metadata on
    that path; the backbone reads the record from the file)."""
    state = release_state('ti', '6b11d4a')
    dst, _, out = convert(cli_main, capsys, state, tmp_path, '--backbone-only')
    assert "backbone needs context_mask='none', proj_norm=True" in out

    def backbone(**options):
        return VMINet('ti', out_indices=(3, ), out_norm='BN', **options,
                      init_cfg=dict(type='Pretrained', checkpoint=str(dst), prefix='backbone.'))

    with pytest.raises(ValueError, match=r"release revision 6b11d4a, whose blocks need context_mask='none'"):
        backbone().init_weights()
    model = backbone(context_mask='none')
    model.init_weights()
    assert torch.equal(model.stages[2][5].g.bn.running_var, state['stages.2.5.g.bn.running_var'])


def test_without_record_missing_g_bn_keys_are_an_error():
    """A state dict without the record (plain dict): the keys still tell proj_norm."""
    old, _ = release_to_mmppma(release_state('ti', '7c2632c'), 'VMINet', backbone_only=True)
    old = {k[len('backbone.'):]: v for k, v in old.items()}  # a plain dict: no load metadata
    with pytest.raises(ValueError, match=r'no stages\.\*\.g\.bn\.\* keys.*Set proj_norm=False'):
        VMINet('ti', out_indices=(3, ), out_norm='BN').load_state_dict(old, strict=False)
    new, _ = release_to_mmppma(release_state('ti', '6b11d4a'), 'VMINet', backbone_only=True)
    new = {k[len('backbone.'):]: v for k, v in new.items()}
    with pytest.raises(ValueError, match=r'has stages\.\*\.g\.bn\.\* keys.*Set proj_norm=True'):
        VMINet('ti', out_indices=(3, ), out_norm='BN', proj_norm=False).load_state_dict(new, strict=False)
    raw = {k: v for k, v in release_state('ti', '7c2632c').items() if k.startswith(('stem.', 'stages.'))}
    with pytest.raises(ValueError, match='unconverted VMINet release state dict.*vminet_official_to_mmppma'):
        VMINet('ti', out_indices=(3, ), out_norm=None, proj_norm=False).load_state_dict(raw)


def test_converter_rejects_configs_and_layouts_of_other_options():
    state = empty_state('ti', '6b11d4a')
    with pytest.raises(CheckpointMismatchError, match=r"model.backbone has context_mask='tril'; the release revision "
                       r"6b11d4a needs context_mask='none'"):
        release_to_mmppma(state, 'VMINet', config=REPO / 'configs' / 'vminet_ti_8xb128_in1k.py')
    mixed = {k: v for k, v in state.items() if '.g.bn.' not in k}  # dwconv without g.bn: neither revision
    with pytest.raises(CheckpointMismatchError, match="neither release revision's layout"):
        release_to_mmppma(mixed, 'VMINet')
