"""MLLA backbone (and its PPMLA option) tests: the release's parameter counts and FLOPs, any input size,
the standard backbone fields, PPMLA against a dense float64 computation, and the configs in mmpretrain,
mmdet and mmseg. Named archs are built on the meta device (counts) or once (FLOPs); forwards use a small arch."""
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.config import Config

from mmppma.models import MLLA
from mmppma.models.backbones.mlla import MLLA_ARCH_ZOO
from mmppma.models.layers.mlla import MLLAAttention, mlla_rope_tables
from tests.ops.oracle import mask_v2h

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / 'configs'
SMALL = dict(embed_dims=[16, 32, 32, 64], depths=[1, 1, 2, 1], num_heads=[2, 2, 4, 4], mlp_ratio=2.0)

# With the 1000-class head (backbone with norm3 + Linear(C, 1000)): the release's own model (LeapLabTHU/MLLA
# models/mlla.py, whose final `norm` is our norm3) has exactly these (checked against a transcription of it,
# same state-dict keys and shapes, same logits at 224x224); its README rounds them to 25M / 43M / 96M.
PARAM_COUNTS = {'tiny': 24_392_200, 'small': 43_015_048, 'base': 95_983_960}
RELEASE_PARAMS = {'tiny': 24.4e6, 'small': 43.0e6, 'base': 96.0e6}
RELEASE_GFLOPS = {'tiny': 4.2e9, 'small': 7.3e9, 'base': 16.2e9}


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def down(n: int, times: int) -> int:
    for _ in range(times):
        n = -(-n // 2)
    return n


class Classifier(nn.Module):
    """The release's classifier: backbone (norm3 on the last stage), global average pool, Linear(C, 1000)."""

    def __init__(self, backbone: MLLA) -> None:
        super().__init__()
        self.backbone = backbone
        self.fc = nn.Linear(backbone.embed_dims[-1], 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x)[-1].mean((2, 3)))


# ---------------------------------------------------------------- named archs
@pytest.mark.parametrize('arch', list(PARAM_COUNTS))
def test_param_counts_with_head(arch):
    with torch.device('meta'):
        model = Classifier(MLLA(arch, out_indices=(3, )))
    assert num_params(model) == PARAM_COUNTS[arch]
    assert num_params(model) == pytest.approx(RELEASE_PARAMS[arch], rel=0.01)


def test_ppmla_adds_only_decay_parameters():
    """Per block: dt_linear (2 x head_dims) + A_log + dt_bias (one per head)."""
    s = MLLA_ARCH_ZOO['tiny']
    extra = sum(depth * (2 * dims // heads + 2 * heads)
                for depth, dims, heads in zip(s['depths'], s['embed_dims'], s['num_heads']))
    with torch.device('meta'):
        model = Classifier(MLLA('tiny', attn='ppmla', out_indices=(3, )))
    assert num_params(model) == PARAM_COUNTS['tiny'] + extra


def test_tiny_flops_match_release():
    """4.2 GFLOPs at 224x224 (README; mmengine's counter, one multiply-add = one FLOP). Within 5%.
    S and B count 7.28 / 16.16 G the same way (7.3 / 16.2 in the README); not run here to save time."""
    from mmppma.models.utils import count_flops
    total, _ = count_flops(Classifier(MLLA('tiny', out_indices=(3, ))).eval(), torch.randn(1, 3, 224, 224))
    assert total == pytest.approx(RELEASE_GFLOPS['tiny'], rel=0.05)


def test_state_dict_keys_follow_release_names():
    with torch.device('meta'):
        keys = set(MLLA('tiny', out_indices=(3, )).state_dict())
    block = 'layers.2.blocks.7.'
    for name in ('cpe1.weight', 'norm1.weight', 'in_proj.weight', 'act_proj.bias', 'dwc.weight', 'attn.qk.weight',
                 'attn.lepe.weight', 'out_proj.weight', 'cpe2.bias', 'norm2.bias', 'mlp.fc1.weight', 'mlp.fc2.bias'):
        assert block + name in keys
    assert {'patch_embed.conv1.conv.weight', 'patch_embed.conv2.1.norm.running_var', 'patch_embed.conv3.1.conv.weight',
            'layers.0.downsample.conv.0.conv.bias', 'layers.0.downsample.conv.2.norm.weight', 'norm3.weight'} <= keys
    assert not any(k.startswith('layers.3.downsample') or 'rope' in k or 'path_embed' in k for k in keys)


# ---------------------------------------------------------------- arguments and errors
def test_arch_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match=r"arch='huge'.*base.*small.*tiny"):
        MLLA('huge')
    with pytest.raises(ValueError, match=r"unknown keys \['attn_types'\].*embed_dims"):
        MLLA(dict(SMALL, attn_types=['whole'] * 4))
    with pytest.raises(ValueError, match=r"missing keys \['num_heads'\]"):
        MLLA({k: v for k, v in SMALL.items() if k != 'num_heads'})
    with pytest.raises(ValueError, match='embed_dims=18 must be divisible.*by 4'):
        MLLA(dict(SMALL, embed_dims=[18, 32, 32, 64]))
    with pytest.raises(ValueError, match=r"attn='softmax'.*'mlla', 'ppmla'"):
        MLLA(SMALL, attn='softmax')
    with pytest.raises(ValueError, match='frozen_stages'):
        MLLA(SMALL, frozen_stages=5)
    with pytest.raises(ValueError, match='out_indices'):
        MLLA(SMALL, out_indices=(4, ))
    with pytest.raises(ValueError, match='in_channels'):
        MLLA(SMALL)(torch.randn(1, 4, 32, 32))


def test_arch_aliases():
    with torch.device('meta'):
        assert MLLA('t').arch_settings == MLLA('Tiny').arch_settings == dict(MLLA_ARCH_ZOO['tiny'])


# ---------------------------------------------------------------- forward at any size
@pytest.mark.parametrize('attn', ['mlla', 'ppmla'])
@pytest.mark.parametrize('h,w', [(97, 131), (33, 65), (5, 3)])
def test_forward_any_size_batch_one(attn, h, w):
    """Odd sizes down to 1-pixel-wide late stages: four NCHW outputs of ceil(H / 2^(i+2)) x ceil(W / 2^(i+2))."""
    model = MLLA(SMALL, attn=attn).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, h, w))
    assert [tuple(o.shape) for o in outs] == [(1, c, down(h, i + 2), down(w, i + 2))
                                              for i, c in enumerate(SMALL['embed_dims'])]
    assert all(torch.isfinite(o).all() for o in outs)


def test_out_indices_and_norms():
    model = MLLA(SMALL, out_indices=(1, -1))
    assert model.out_indices == (1, 3) and hasattr(model, 'norm1') and not hasattr(model, 'norm0')
    outs = model.eval()(torch.randn(2, 3, 40, 24))
    assert [o.shape[1] for o in outs] == [32, 64]
    # a normed output has zero mean / unit variance over channels at every position
    torch.testing.assert_close(outs[0].mean(1), torch.zeros_like(outs[0][:, 0]), atol=1e-5, rtol=0)
    assert not any(n.startswith('norm') for n, _ in MLLA(SMALL, out_norm=False).named_children())


def test_rope_is_computed_for_the_actual_size():
    """The release's table (pairs turned by row i for the first C/4 pairs, column j for the rest,
    theta_t = 10000^(-t / (C/4))), as a complex product, at a non-square size."""
    h, w, c = 3, 5, 8
    sin, cos = mlla_rope_tables(h, w, c)
    theta = 1.0 / 10000**(torch.arange(c // 4, dtype=torch.float64) / (c // 4))
    i, j = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
    angles = torch.cat([i[..., None] * theta, j[..., None] * theta], dim=-1)  # (h, w, c/2)
    x = torch.randn(h, w, c, dtype=torch.float64)
    want = torch.view_as_real(torch.view_as_complex(x.view(h, w, c // 2, 2)) * torch.polar(torch.ones_like(angles),
                                                                                           angles)).flatten(-2)
    from mmppma.models.layers import apply_rope
    torch.testing.assert_close(apply_rope(x, sin.double(), cos.double()), want, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- PPMLA
def test_ppmla_equals_dense_float64():
    """PPMLA attention on a 5 x 7 map equals ((phi(q~) phi(k~)^T) * L2D) v / ((phi(q) phi(k)^T) * L2D) 1 + lepe(v),
    with L2D = L + L^T from the loop oracle (tests/ops/oracle.py), q~, k~ RoPE'd, phi = elu + 1."""
    torch.manual_seed(0)
    c, heads, h, w = 16, 2, 5, 7
    d = c // heads
    attn = MLLAAttention(c, heads, attn='ppmla', impl='torch').double()
    with torch.no_grad():  # decays of a useful size (the init's are near 0: L2D ~ 2 everywhere)
        attn.path_embed.A_log.fill_(0.3)
        attn.path_embed.dt_bias.fill_(0.5)
    x = torch.randn(2, h, w, c, dtype=torch.float64)
    out = attn(x, mlla_rope_tables(h, w, c))

    with torch.no_grad():
        la, lb = (t.double().numpy() for t in attn.path_embed(x))
        q, k = (torch.nn.functional.elu(t) + 1 for t in attn.qk(x).chunk(2, -1))
        sin, cos = (t.double() for t in mlla_rope_tables(h, w, c))

        def rot(t):  # the release's complex-pair rotation
            return torch.stack([t[..., 0::2] * cos[..., 0::2] - t[..., 1::2] * sin[..., 0::2],
                                t[..., 1::2] * cos[..., 0::2] + t[..., 0::2] * sin[..., 0::2]], -1).flatten(-2)

        qr, kr = rot(q), rot(k)
        want = torch.empty_like(x)
        for b in range(x.shape[0]):
            for n in range(heads):
                l2d = np.exp(mask_v2h(la[b, n], lb[b, n]))
                l2d = torch.from_numpy(l2d + l2d.T)
                sl = slice(n * d, (n + 1) * d)
                flat = [t[b, ..., sl].reshape(h * w, d) for t in (q, k, qr, kr, x)]
                num = ((flat[2] @ flat[3].T) * l2d) @ flat[4]
                mass = ((flat[0] @ flat[1].T) * l2d).sum(-1, keepdim=True)
                want[b, ..., sl] = (num / (mass + attn.eps)).reshape(h, w, d)
        want = want + attn.lepe(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)


def test_ppmla_with_zero_decays_is_mlla():
    """L2D = 2 everywhere when every decay is 0: the masked mass normalization gives MLLA's attention back."""
    torch.manual_seed(0)
    mlla = MLLAAttention(16, 2, attn='mlla').double()
    ppmla = MLLAAttention(16, 2, attn='ppmla').double()
    ppmla.load_state_dict(mlla.state_dict(), strict=False)
    with torch.no_grad():
        ppmla.path_embed.A_log.fill_(-float('inf'))  # A = -exp(A_log) = 0
    x = torch.randn(1, 6, 9, 16, dtype=torch.float64)
    rope = mlla_rope_tables(6, 9, 16)
    torch.testing.assert_close(ppmla(x, rope), mlla(x, rope), rtol=1e-6, atol=1e-6)


def test_ppmla_backward_reaches_the_decays():
    model = MLLA(SMALL, attn='ppmla', out_indices=(3, ))
    model(torch.randn(2, 3, 24, 40))[0].sum().backward()
    pe = model.layers[2].blocks[1].attn.path_embed
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in pe.parameters())


# ---------------------------------------------------------------- standard backbone fields
def test_frozen_stages():
    model = MLLA(SMALL, frozen_stages=2)
    model.train()
    frozen = [model.patch_embed, model.layers[0], model.layers[1], model.norm0, model.norm1]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(not m.training for f in frozen for m in f.modules())
    assert all(p.requires_grad for p in model.layers[2].parameters()) and model.layers[2].training
    bn = model.patch_embed.conv1.norm
    before = bn.running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(bn.running_mean, before)
    stem_only = MLLA(SMALL, frozen_stages=0)
    assert not any(p.requires_grad for p in stem_only.patch_embed.parameters())
    assert all(p.requires_grad for p in stem_only.layers[0].parameters())


def test_norm_eval():
    model = MLLA(SMALL, norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    assert model.layers[0].blocks[0].norm1.training  # LayerNorms are unaffected


def test_with_cp_same_result_and_non_reentrant(monkeypatch):
    torch.manual_seed(0)
    plain = MLLA(SMALL, attn='ppmla')
    ckpt = MLLA(SMALL, attn='ppmla', with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    calls = []
    import torch.utils.checkpoint as cp
    original = cp.checkpoint

    def spy(*args, **kwargs):
        calls.append(kwargs.get('use_reentrant'))
        return original(*args, **kwargs)

    monkeypatch.setattr(cp, 'checkpoint', spy)
    x = torch.randn(2, 3, 20, 16)
    outs = [sum(o.sum() for o in m.train()(x)) for m in (plain, ckpt)]
    torch.testing.assert_close(outs[0], outs[1])
    outs[1].backward()
    assert calls and set(calls) == {False} and len(calls) == sum(SMALL['depths'])
    assert ckpt.layers[0].blocks[0].in_proj.weight.grad is not None


def test_drop_path_linear_over_blocks():
    model = MLLA(SMALL, drop_path_rate=0.4)
    rates = [b.drop_path.drop_prob for layer in model.layers for b in layer.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.4, sum(SMALL['depths'])).tolist())


def test_pretrained_init_cfg_with_prefix(tmp_path):
    src = MLLA(SMALL)
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()}}, tmp_path / 'w.pth')
    dst = MLLA(SMALL, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'w.pth'), prefix='backbone.'))
    dst.init_weights()
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_get_layer_depth_and_layer_decay_constructor():
    model = MLLA(SMALL)
    n = sum(SMALL['depths']) + 2
    assert model.get_layer_depth('backbone.patch_embed.conv1.conv.weight', 'backbone.') == (0, n)
    assert model.get_layer_depth('backbone.layers.0.blocks.0.attn.qk.weight', 'backbone.') == (1, n)
    assert model.get_layer_depth('backbone.layers.2.blocks.1.mlp.fc1.weight', 'backbone.') == (4, n)
    assert model.get_layer_depth('backbone.layers.2.downsample.conv.0.conv.weight', 'backbone.') == (4, n)
    assert model.get_layer_depth('backbone.norm3.weight', 'backbone.') == (n - 1, n)
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (n - 1, n)

    from mmppma.engine import LayerDecayOptimWrapperConstructor
    wrapper = nn.Module()
    wrapper.backbone = MLLA(SMALL, attn='ppmla')
    optim = LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05)),
        dict(layer_decay_rate=0.5))(wrapper).optimizer
    by_param = {id(p): g for g in optim.param_groups for p in g['params']}
    stem = by_param[id(wrapper.backbone.patch_embed.conv1.conv.weight)]
    a_log = by_param[id(wrapper.backbone.layers[0].blocks[0].attn.path_embed.A_log)]
    assert stem['lr'] == pytest.approx(0.5**(n - 1)) and stem['weight_decay'] == 0.05
    assert a_log['weight_decay'] == 0.0


def test_autocast_bfloat16():
    model = MLLA(SMALL, attn='ppmla').eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 35, 29))
    assert all(torch.isfinite(o.float()).all() for o in outs)


# ---------------------------------------------------------------- configs
def _cfg(name: str) -> Config:
    return Config.fromfile(str(CONFIGS / name))


@pytest.mark.parametrize('size,arch,drop,dims', [('t', 'tiny', 0.2, 512), ('s', 'small', 0.3, 512),
                                                 ('b', 'base', 0.5, 768)])
def test_in1k_config_contents(size, arch, drop, dims, mmpretrain_ready):
    cfg = _cfg(f'mlla_{size}_8xb128_in1k.py')
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate, tuple(bb.out_indices), bb.out_norm) == ('mmppma.MLLA', arch, drop,
                                                                                         (3, ), True)
    assert cfg.model.neck.type == 'GlobalAveragePooling'
    assert (cfg.model.head.type, cfg.model.head.in_channels, cfg.model.head.num_classes) == ('LinearClsHead', dims,
                                                                                             1000)
    opt = cfg.optim_wrapper
    assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == ('AdamW', 1e-3, 0.05)
    assert opt.clip_grad.max_norm == 5.0 and cfg.auto_scale_lr.base_batch_size == 1024
    assert cfg.train_dataloader.batch_size == 128 and cfg.train_dataloader.sampler.type == 'DefaultSampler'
    warmup, cosine = cfg.param_scheduler
    assert (warmup.end, warmup.start_factor, cosine.eta_min, cfg.train_cfg.max_epochs) == (20, 1e-3, 1e-5, 300)
    assert [a.alpha for a in cfg.model.train_cfg.augments] == [0.8, 1.0]
    assert cfg.custom_hooks[0].type == 'EMAHook' and cfg.custom_hooks[0].momentum == 1e-4


def test_ppmla_in1k_config_is_mlla_t_with_ppmla(mmpretrain_ready):
    ppmla, mlla = _cfg('ppmla_t_8xb128_in1k.py'), _cfg('mlla_t_8xb128_in1k.py')
    assert ppmla.model.backbone.pop('attn') == 'ppmla'
    assert ppmla.model.to_dict() == mlla.model.to_dict()
    assert ppmla.optim_wrapper.paramwise_cfg.no_decay_names == ['A_log', 'dt_bias']


def test_in1k_classifier_builds_with_release_param_count(mmpretrain_ready):
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    with torch.device('meta'):
        model = MODELS.build(_cfg('mlla_t_8xb128_in1k.py').model)
    assert num_params(model) == PARAM_COUNTS['tiny']


@pytest.mark.parametrize('name', ['mask_rcnn_mlla_t_1x_coco.py', 'mask_rcnn_mlla_s_1x_coco.py',
                                  'mask_rcnn_mlla_b_1x_coco.py', 'mask_rcnn_ppmla_t_1x_coco.py'])
def test_detection_config_contents(name, mmdet_ready):
    cfg = _cfg(name)
    size = name.split('_')[3]
    arch = {'t': 'tiny', 's': 'small', 'b': 'base'}[size]
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate, tuple(bb.out_indices), bb.out_norm) == ('mmppma.MLLA', arch, 0.1,
                                                                                         (0, 1, 2, 3), True)
    assert bb.get('attn', 'mlla') == ('ppmla' if 'ppmla' in name else 'mlla')
    assert cfg.model.neck.in_channels == MLLA_ARCH_ZOO[arch]['embed_dims']
    family = 'ppmla' if 'ppmla' in name else 'mlla'
    checkpoint = f'checkpoints/{family}_{size}_in1k.pth'
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')
    opt = cfg.optim_wrapper
    assert (opt.optimizer.lr, opt.optimizer.weight_decay, opt.paramwise_cfg.norm_decay_mult) == (1e-4, 0.05, 0.0)
    assert cfg.train_cfg.max_epochs == 12 and cfg.param_scheduler[1].milestones == [8, 11]
    choice = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomChoice'][0]
    assert sorted(s[0] for s in choice.transforms[0][0].scales) == list(range(480, 801, 32))


@pytest.mark.parametrize('family,size', [('mlla', 't'), ('mlla', 's'), ('mlla', 'b'), ('ppmla', 't')])
def test_segmentation_config_contents(family, size, mmseg_ready):
    cfg = _cfg(f'upernet_{family}_{size}_512x512_160k_ade20k.py')
    arch = {'t': 'tiny', 's': 'small', 'b': 'base'}[size]
    dims = MLLA_ARCH_ZOO[arch]['embed_dims']
    bb = cfg.model.backbone
    assert (bb.type, bb.arch, bb.drop_path_rate) == ('mmppma.MLLA', arch, {'t': 0.2, 's': 0.3, 'b': 0.5}[size])
    assert bb.get('attn', 'mlla') == family
    checkpoint = f'checkpoints/{family}_{size}_in1k.pth'
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.')
    assert cfg.model.decode_head.in_channels == dims and cfg.model.auxiliary_head.in_channels == dims[2]
    opt = cfg.optim_wrapper
    assert (opt.optimizer.lr, opt.optimizer.weight_decay) == (6e-5, 0.01)
    assert cfg.train_cfg.max_iters == 160000 and cfg.model.pretrained is None


def _small_backbone(cfg: Config) -> None:
    cfg.model.backbone.arch = SMALL
    cfg.model.backbone.init_cfg = None


def test_mmdet_mask_rcnn_from_config_losses(mmdet_ready):
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.registry import init_default_scope
    from mmengine.structures import InstanceData
    cfg = _cfg('mask_rcnn_ppmla_t_1x_coco.py')
    _small_backbone(cfg)
    cfg.model.backbone.frozen_stages = 1
    cfg.model.neck.in_channels = SMALL['embed_dims']
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    sample = DetDataSample(metainfo=dict(img_shape=(64, 96), pad_shape=(64, 96), ori_shape=(64, 96),
                                         scale_factor=(1.0, 1.0), batch_input_shape=(64, 96)))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[5.0, 5.0, 40.0, 50.0]]), labels=torch.tensor([1]),
        masks=BitmapMasks(np.zeros((1, 64, 96), dtype=np.uint8), 64, 96))
    losses = model(torch.randn(1, 3, 64, 96), [sample], mode='loss')
    total = sum(v.sum() if torch.is_tensor(v) else sum(x.sum() for x in v) for k, v in losses.items() if 'loss' in k)
    total.backward()
    assert model.backbone.layers[1].blocks[0].attn.path_embed.A_log.grad is not None
    assert model.backbone.layers[0].blocks[0].mlp.fc1.weight.grad is None  # frozen_stages=1


def test_mmseg_upernet_from_config_forward(mmseg_ready):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = _cfg('upernet_mlla_t_512x512_160k_ade20k.py')
    _small_backbone(cfg)
    norm_cfg = dict(type='BN', requires_grad=True)
    cfg.model.decode_head.update(in_channels=SMALL['embed_dims'], channels=16, num_classes=5, norm_cfg=norm_cfg)
    cfg.model.auxiliary_head.update(in_channels=SMALL['embed_dims'][2], channels=8, num_classes=5, norm_cfg=norm_cfg)
    init_default_scope('mmseg')
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 50, 70), mode='tensor')
    assert logits.shape == (1, 5, 13, 18)


def test_mmpretrain_classifier_from_config_trains_one_step(mmpretrain_ready):
    from mmpretrain.apis import get_model
    from mmpretrain.structures import DataSample
    cfg = _cfg('mlla_t_8xb128_in1k.py')
    _small_backbone(cfg)
    cfg.model.head.update(in_channels=SMALL['embed_dims'][-1], num_classes=10)
    cfg.model.data_preprocessor = dict(cfg.data_preprocessor, num_classes=10)
    model = get_model(cfg).train()
    inputs = [torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8) for _ in range(2)]
    samples = [DataSample().set_gt_label(3), DataSample().set_gt_label(7)]
    data = model.data_preprocessor(dict(inputs=inputs, data_samples=samples), training=True)
    loss = model(**data, mode='loss')['loss']
    loss.backward()
    assert torch.isfinite(loss)
