"""Layer tests against independent dense re-derivations of docs/method.md §1-3 (written here from the text, not
with mmppma.ops or the layers' own helpers), in float64 on odd shapes."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from mmppma.models.layers import PPMA_MASKS, PathEmbed, PolylinePathAttention, RasterRoPE2D, apply_rope
from mmppma.ops import export_mode

from .conftest import ref_v2h_mask


def ref_rope(x: torch.Tensor) -> torch.Tensor:
    """x: (..., H, W, d). theta_m = 10000^(-m/(d/2-1)); p = i*W + j; pairs (2m, 2m+1) rotated by p*theta_m."""
    *_, h, w, d = x.shape
    theta = torch.tensor([10000.0**(-m / (d // 2 - 1)) for m in range(d // 2)], dtype=torch.float64)
    a = torch.arange(h * w, dtype=torch.float64).view(h, w, 1) * theta
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * a.cos() - x1 * a.sin(), x1 * a.cos() + x0 * a.sin()], -1).flatten(-2)


def ref_decays(x, dt_weight, a_log, dt_bias, heads):
    """x (B, H, W, C) -> la, lb (B, heads, H, W) per docs/method.md §1 (dt_weight (2|1, d))."""
    b, h, w, c = x.shape
    dt = torch.einsum('bhwnd,kd->bnkhw', x.reshape(b, h, w, heads, c // heads), dt_weight)
    a = -torch.exp(a_log)[None, :, None, None]
    return tuple(F.softplus(dt[:, :, k] + dt_bias[None, :, None, None]) * a for k in (0, -1))


def ref_attention_module(mod: PolylinePathAttention, x: torch.Tensor, decay=None, parts: bool = False):
    """The whole token mixer from docs/method.md §3, densely: (B, H, W, C) -> (B, H, W, C). With ``parts``: the
    attention matrix A (out = A v), the log-mask M and the scores S instead, each (B, n, N, N)."""
    b, h, w, c = x.shape
    n, d = mod.num_heads, c // mod.num_heads
    q, k, v = (F.linear(x, lin.weight, lin.bias) for lin in (mod.q_proj, mod.k_proj, mod.v_proj))
    lepe = F.conv2d(v.permute(0, 3, 1, 2), mod.lepe.conv.weight, mod.lepe.conv.bias, padding=2, groups=c)
    q, k, v = (t.reshape(b, h, w, n, d).permute(0, 3, 1, 2, 4) for t in (q, k * d**-0.5, v))  # (B, n, H, W, d)
    qf, kf, vf = (t.reshape(b, n, h * w, d) for t in (ref_rope(q), ref_rope(k), v))
    s = qf @ kf.transpose(-1, -2)
    ii, jj = torch.arange(h * w) // w, torch.arange(h * w) % w
    same_row, same_col = ii[:, None] == ii[None], jj[:, None] == jj[None]
    if mod.mask == 'rmt':  # the Manhattan distance times the head's decay
        m = decay.view(1, -1, 1, 1) * ((ii[:, None] - ii[None]).abs() + (jj[:, None] - jj[None]).abs()).to(x.dtype)
    elif mod.mask == 'none':
        m = torch.zeros_like(s)
    else:
        pe = mod.path_embed
        m = ref_v2h_mask(*ref_decays(x, pe.dt_linear.weight, pe.A_log, pe.dt_bias, n))

    def sm(bias, where=None):
        return (s + bias if where is None else (s + bias).masked_fill(~where, float('-inf'))).softmax(-1)

    if mod.attn_type == 'whole' and mod.mask in ('polyline', 'shared') and mod.form != 'v2h':
        two_paths = m.exp() + m.transpose(-1, -2).exp()
        attn = s.softmax(-1) * two_paths if mod.form == 'paper' else 0.5 * sm(m) + 0.5 * sm(m.transpose(-1, -2))
    elif mod.attn_type == 'whole':  # form v2h, rmt, none: one softmax with M
        attn = sm(m)
    else:  # on a row / column the V2H mask is the 1D segment mask (and RMT's the 1D distance decay)
        aw, ah = sm(m, same_row), sm(m, same_col)
        # RMT: rows first; form v2h: down the key's column, then along the query's row; else both orders
        attn = ah @ aw if mod.mask == 'rmt' else aw @ ah if mod.form == 'v2h' else 0.5 * ah @ aw + 0.5 * aw @ ah
    if parts:
        return attn, m, s
    out = (attn @ vf).reshape(b, n, h, w, d).permute(0, 2, 3, 1, 4).reshape(b, h, w, c)
    return F.linear(out + lepe.permute(0, 2, 3, 1), mod.out_proj.weight, mod.out_proj.bias)


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize('inplace', [False, True])
def test_rope_matches_reference(dtype, inplace):
    """Tables at odd sizes, with autograd and without; in inference in place or not, strided, heads interleaved."""
    heads, d = 2, 8
    rope = RasterRoPE2D(d, num_heads=heads).double()
    assert rope.angle.shape == (d, )
    for (h, w), grad in itertools.product([(4, 1), (1, 4), (2, 2), (3, 5)], (True, False)):
        x = torch.randn(2, heads, h, w, d, dtype=torch.float64, requires_grad=grad)
        tables = rope(h, w)
        got = apply_rope(x, tables.sin.double(), tables.cos.double())
        torch.testing.assert_close(got, ref_rope(x), rtol=1e-5, atol=1e-5)
    sin, cos = tables.sin.to(dtype).unsqueeze(-2), tables.cos.to(dtype).unsqueeze(-2)
    tokens = torch.randn(2, h, w, heads, d, dtype=torch.float64)
    want = ref_rope(tokens.permute(0, 3, 1, 2, 4)).permute(0, 2, 3, 1, 4)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    with export_mode(), torch.no_grad():  # the export form: the pair swap as a product with a +-1 matrix
        torch.testing.assert_close(apply_rope(tokens.to(dtype, copy=True), sin, cos, inplace=inplace).double(), want,
                                   **tol)
    for x in (tokens.to(dtype), tokens.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)):
        before = x.clone()
        with torch.no_grad():
            got = apply_rope(x, sin, cos, inplace=inplace)
        torch.testing.assert_close(got.double(), want, **tol)
        assert (got.data_ptr() == x.data_ptr()) == inplace
        assert inplace or torch.equal(x, before)


def test_path_embed_formula_shapes_and_float32():
    """The decays of docs/method.md §1, (B, heads, H, W), <= 0, float32 under bf16 autocast; one direction: la is lb."""
    pe = PathEmbed(num_heads=3, head_dims=4).double()
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64)
    la, lb = pe(x)
    assert la.shape == lb.shape == (2, 3, 3, 5) and la.dtype == torch.float32
    want_a, want_b = ref_decays(x, pe.dt_linear.weight, pe.A_log, pe.dt_bias, 3)
    torch.testing.assert_close(la, want_a.float())
    torch.testing.assert_close(lb, want_b.float())
    assert (la <= 0).all() and (lb <= 0).all()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert all(t.dtype == torch.float32 for t in pe.float()(x.float()))
    shared = PathEmbed(num_heads=3, head_dims=4, directions=1)
    sa, sb = shared(x.float())
    assert sa is sb and shared.dt_linear.weight.shape == (1, 4)


def test_path_embed_init_distributions():
    """docs/method.md §1: A_log = log U(1, 1.1); dt_bias = softplus^-1(dt0), dt0 log-uniform in [1e-3, 1e-1]."""
    pe = PathEmbed(num_heads=4096, head_dims=4)
    a = pe.A_log.detach().exp()
    assert a.min() >= 1.0 and a.max() <= 1.1
    assert abs(a.mean().item() - 1.05) < 0.005  # uniform mean
    dt = F.softplus(pe.dt_bias.detach().double())  # invert the inverse softplus
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4)
    lo, hi = math.log(1e-3), math.log(1e-1)
    assert abs(dt.log().mean().item() - (lo + hi) / 2) < 0.05  # log-uniform: uniform in log space
    assert abs(dt.log().std().item() - (hi - lo) / math.sqrt(12)) < 0.05


CASES = [(t, m, 'release') for t in ('whole', 'criss_cross') for m in PPMA_MASKS] + [
    ('whole', 'polyline', 'paper'), ('whole', 'polyline', 'v2h'), ('criss_cross', 'polyline', 'v2h'),
    ('criss_cross', 'shared', 'v2h')]


def attention_layer(attn_type, mask, form, c=8, n=2):
    """The layer in float64 with weights large enough that masks and RoPE matter, and its position module."""
    mod = PolylinePathAttention(c, n, attn_type=attn_type, mask=mask, form=form, impl='torch').double()
    for p in mod.parameters():
        p.data.normal_(0, 0.5)
    if mod.path_embed is not None:
        mod.path_embed.A_log.data.uniform_(-1, 0.5)
    return mod, RasterRoPE2D(c // n, n, heads_range=4 if mask == 'rmt' else None).double()


@pytest.mark.parametrize('attn_type,mask,form', CASES)
def test_attention_layer_and_its_query_maps_match_the_dense_reference(attn_type, mask, form):
    mod, rope = attention_layer(attn_type, mask, form)
    for h, w in [(3, 5), (4, 1)]:
        x = torch.randn(2, h, w, 8, dtype=torch.float64)
        torch.testing.assert_close(mod(x, rope(h, w)), ref_attention_module(mod, x, rope.decay), rtol=1e-6,
                                   atol=1e-6)
    h, w, queries = 3, 4, [(0, 0), (1, 2), (2, 3)]
    x = torch.randn(2, h, w, 8, dtype=torch.float64)
    maps = mod.query_maps(x, rope(h, w), queries)
    attn, m, s = ref_attention_module(mod, x, rope.decay, parts=True)
    rows = [i * w + j for i, j in queries]
    two_paths = mask in ('polyline', 'shared') and form != 'v2h'
    want_mask = m.exp() + m.transpose(-1, -2).exp() if two_paths else m.exp()
    for key, want in (('attention', attn), ('mask', want_mask), ('unmasked', s.softmax(-1))):
        assert maps[key].shape == (2, 2, len(queries), h, w) and maps[key].dtype == torch.float32
        want = want.expand(2, -1, -1, -1)[:, :, rows].float()  # RMT's mask: one for the batch
        torch.testing.assert_close(maps[key].flatten(-2), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='outside the 3 x 4 token grid'):
        mod.query_maps(x, rope(h, w), [(3, 0)])


def test_attention_rejects_bad_choices():
    for kwargs, message in ((dict(mask='hilbert'), "mask='hilbert'"), (dict(form='dense'), "form='dense'"),
                            (dict(attn_type='local'), r"attn_types\[0\]='local'"),
                            (dict(embed_dims=10, num_heads=4), 'divisible'),
                            (dict(mask='v2h'), "mask='polyline', form='v2h'"),
                            (dict(mask='none', form='v2h'), "form='v2h' applies to a learned mask"),
                            (dict(attn_type='criss_cross', form='paper'), r"stages \[0\] are 'criss_cross'")):
        with pytest.raises(ValueError, match=message):
            PolylinePathAttention(**{'embed_dims': 8, 'num_heads': 2, **kwargs})
