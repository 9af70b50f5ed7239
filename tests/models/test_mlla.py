"""What is MLLA's own (the contract every backbone keeps: test_backbone_contract.py): the release's parameter
counts, FLOPs and key names, RoPE at the actual size, and PPMLA (``mask='polyline'``) against dense float64."""
import pytest
import torch
import torch.nn.functional as F

from mmppma.models import MLLA
from mmppma.models.backbones.mlla import MLLA_ARCH_ZOO
from mmppma.models.layers import apply_rope
from mmppma.models.layers.mlla import MLLAAttention, mlla_rope_tables

from .conftest import MLLA_ARCH, Classifier, num_params, ref_v2h_mask

# With the 1000-class head (norm3 + Linear(C, 1000)): exactly the release model's (LeapLabTHU/MLLA models/mlla.py,
# checked against a transcription: same keys, shapes and logits at 224x224); its README rounds them to 25M/43M/96M.
PARAM_COUNTS = {'tiny': 24_392_200, 'small': 43_015_048, 'base': 95_983_960}
RELEASE_PARAMS = {'tiny': 24.4e6, 'small': 43.0e6, 'base': 96.0e6}


@pytest.mark.parametrize('arch', list(PARAM_COUNTS))
def test_param_counts_with_head(arch):
    """PPMLA adds per block only its decay parameters: dt_linear (2 x head_dims) + A_log + dt_bias (per head)."""
    with torch.device('meta'):
        counts = [num_params(Classifier(MLLA(arch, mask=m, out_indices=(3, )))) for m in ('none', 'polyline')]
    assert counts[0] == PARAM_COUNTS[arch] == pytest.approx(RELEASE_PARAMS[arch], rel=0.01)
    s = MLLA_ARCH_ZOO[arch]
    assert counts[1] - counts[0] == sum(depth * (2 * dims // heads + 2 * heads)
                                        for depth, dims, heads in zip(s['depths'], s['embed_dims'], s['num_heads']))


def test_tiny_flops_match_release():
    """4.2 GFLOPs at 224x224 (README; mmengine's counter, one multiply-add = one FLOP), within 5%."""
    from mmppma.models.flops import count_flops
    total, _ = count_flops(Classifier(MLLA('tiny', out_indices=(3, ))).eval(), torch.randn(1, 3, 224, 224))
    assert total == pytest.approx(4.2e9, rel=0.05)


def test_state_dict_keys_follow_release_names_and_arch_errors():
    with torch.device('meta'):
        keys = set(MLLA('tiny', out_indices=(3, )).state_dict())
    block = 'layers.2.blocks.7.'
    for name in ('cpe1.weight', 'norm1.weight', 'in_proj.weight', 'act_proj.bias', 'dwc.weight', 'attn.qk.weight',
                 'attn.lepe.weight', 'out_proj.weight', 'cpe2.bias', 'norm2.bias', 'mlp.fc1.weight', 'mlp.fc2.bias'):
        assert block + name in keys
    assert {'patch_embed.conv1.conv.weight', 'patch_embed.conv2.1.norm.running_var', 'patch_embed.conv3.1.conv.weight',
            'layers.0.downsample.conv.0.conv.bias', 'layers.0.downsample.conv.2.norm.weight', 'norm3.weight'} <= keys
    assert not any(k.startswith('layers.3.downsample') or 'rope' in k or 'path_embed' in k for k in keys)
    with pytest.raises(ValueError, match='embed_dims=18 must be divisible.*by 4'):
        MLLA(dict(MLLA_ARCH, embed_dims=[18, 32, 32, 64]))


def test_rope_is_computed_for_the_actual_size():
    """The release's table (pairs turned by row i for the first C/4 pairs, column j for the rest, theta_t =
    10000^(-t / (C/4))) as a complex product, at a non-square size."""
    h, w, c = 3, 5, 8
    sin, cos = mlla_rope_tables(h, w, c)
    theta = 1.0 / 10000**(torch.arange(c // 4, dtype=torch.float64) / (c // 4))
    i, j = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
    angles = torch.cat([i[..., None] * theta, j[..., None] * theta], dim=-1)  # (h, w, c/2)
    x = torch.randn(h, w, c, dtype=torch.float64)
    want = torch.view_as_real(torch.view_as_complex(x.view(h, w, c // 2, 2)) * torch.polar(torch.ones_like(angles),
                                                                                           angles)).flatten(-2)
    torch.testing.assert_close(apply_rope(x, sin.double(), cos.double()), want, rtol=0, atol=1e-6)


def test_ppmla_equals_dense_float64():
    """PPMLA attention on a 5 x 7 map equals ((phi(q~) phi(k~)^T) * L2D) v / ((phi(q) phi(k)^T) * L2D) 1 + lepe(v),
    with L2D = exp(M) + exp(M^T) from the dense V2H log-mask, q~, k~ RoPE'd, phi = elu + 1."""
    c, heads, h, w = 16, 2, 5, 7
    attn = MLLAAttention(c, heads, mask='polyline', impl='torch').double()
    with torch.no_grad():  # decays of a useful size (the init's are near 0: L2D ~ 2 everywhere)
        attn.path_embed.A_log.fill_(0.3)
        attn.path_embed.dt_bias.fill_(0.5)
    x = torch.randn(2, h, w, c, dtype=torch.float64)
    out = attn(x, mlla_rope_tables(h, w, c))
    with torch.no_grad():
        m = ref_v2h_mask(*(t.double() for t in attn.path_embed(x)))
        l2d = m.exp() + m.transpose(-1, -2).exp()  # (B, n, N, N)
        q, k = (F.elu(t) + 1 for t in attn.qk(x).chunk(2, -1))
        sin, cos = (t.double() for t in mlla_rope_tables(h, w, c))
        q, k, qr, kr, v = (t.reshape(2, h * w, heads, c // heads).transpose(1, 2)
                           for t in (q, k, apply_rope(q, sin, cos), apply_rope(k, sin, cos), x))
        mass = ((q @ k.transpose(-1, -2)) * l2d).sum(-1, keepdim=True)
        want = (((qr @ kr.transpose(-1, -2)) * l2d) @ v / (mass + attn.eps)).transpose(1, 2).reshape(2, h, w, c)
        want = want + attn.lepe(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-10)


def test_ppmla_with_zero_decays_is_mlla():
    """L2D = 2 everywhere when every decay is 0: the masked mass normalization gives MLLA's attention back."""
    mlla = MLLAAttention(16, 2, mask='none').double()
    ppmla = MLLAAttention(16, 2, mask='polyline').double()
    ppmla.load_state_dict(mlla.state_dict(), strict=False)
    with torch.no_grad():
        ppmla.path_embed.A_log.fill_(-float('inf'))  # A = -exp(A_log) = 0
    x = torch.randn(1, 6, 9, 16, dtype=torch.float64)
    rope = mlla_rope_tables(6, 9, 16)
    torch.testing.assert_close(ppmla(x, rope), mlla(x, rope), rtol=1e-6, atol=1e-6)
