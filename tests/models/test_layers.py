"""Layer tests against independent dense re-derivations of docs/method.md §1-3 (written here from the text, not
with mmppma.ops or the layers' own helpers), in float64 on odd shapes."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmppma.models.layers import PathEmbed, PolylinePathAttention, RasterRoPE2D, apply_rope, rmt_log_decay

SHAPES = [(3, 5), (4, 1), (1, 4), (2, 2)]


# ---------------------------------------------------------------- independent references
def ref_rope(x: torch.Tensor) -> torch.Tensor:
    """x: (..., H, W, d). theta_t = 10000^(-t/(d/2-1)); p = i*W + j; pairs (2m, 2m+1) rotated by p*theta_m."""
    *_, h, w, d = x.shape
    half = d // 2
    out = torch.empty_like(x)
    for m in range(half):
        theta = 10000.0**(-m / (half - 1)) if half > 1 else 1.0
        for i in range(h):
            for j in range(w):
                a = (i * w + j) * theta
                x0, x1 = x[..., i, j, 2 * m], x[..., i, j, 2 * m + 1]
                out[..., i, j, 2 * m] = x0 * math.cos(a) - x1 * math.sin(a)
                out[..., i, j, 2 * m + 1] = x1 * math.cos(a) + x0 * math.sin(a)
    return out


def ref_decays(x, dt_weight, a_log, dt_bias, heads):
    """x (B, H, W, C) -> la, lb (B, heads, H, W) per docs/method.md §1 (dt_weight (2|1, d))."""
    b, h, w, c = x.shape
    xh = x.reshape(b, h, w, heads, c // heads)
    dt = torch.einsum('bhwnd,kd->bnkhw', xh, dt_weight)
    a = -torch.exp(a_log)[None, :, None, None]
    la = F.softplus(dt[:, :, 0] + dt_bias[None, :, None, None]) * a
    lb = F.softplus(dt[:, :, -1] + dt_bias[None, :, None, None]) * a
    return la, lb


def ref_v2h_mask(la, lb):
    """M[(i,j),(k,l)] = -|Ca[i,j]-Ca[i,l]| - |Cb[i,l]-Cb[k,l]|, (B, heads, N, N), loops over positions."""
    b, n, h, w = la.shape
    ca, cb = la.cumsum(-1), lb.cumsum(-2)
    m = torch.empty(b, n, h * w, h * w, dtype=la.dtype)
    for i in range(h):
        for j in range(w):
            for k in range(h):
                for l in range(w):
                    m[:, :, i * w + j, k * w + l] = (-(ca[:, :, i, j] - ca[:, :, i, l]).abs() -
                                                     (cb[:, :, i, l] - cb[:, :, k, l]).abs())
    return m


def ref_manhattan_mask(log_decay, h, w):
    ii, jj = torch.arange(h * w) // w, torch.arange(h * w) % w
    dist = (ii[:, None] - ii[None]).abs() + (jj[:, None] - jj[None]).abs()
    return log_decay.view(1, -1, 1, 1) * dist.to(log_decay.dtype)


def ref_attention_module(mod: PolylinePathAttention, x: torch.Tensor, decay=None, parts: bool = False):
    """The whole token mixer from docs/method.md §3, densely: (B, H, W, C) -> (B, H, W, C). With ``parts``: the
    attention matrix A (out = A v), the log-mask M and the scores S instead, each (B, n, N, N)."""
    b, h, w, c = x.shape
    n, d = mod.num_heads, c // mod.num_heads
    q = F.linear(x, mod.q_proj.weight, mod.q_proj.bias)
    k = F.linear(x, mod.k_proj.weight, mod.k_proj.bias) * d**-0.5
    v = F.linear(x, mod.v_proj.weight, mod.v_proj.bias)
    lepe = F.conv2d(v.permute(0, 3, 1, 2), mod.lepe.conv.weight, mod.lepe.conv.bias, padding=2, groups=c)

    def heads(t):
        return t.reshape(b, h, w, n, d).permute(0, 3, 1, 2, 4)

    q, k, v = ref_rope(heads(q)), ref_rope(heads(k)), heads(v)
    qf, kf, vf = (t.reshape(b, n, h * w, d) for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2)
    ii, jj = torch.arange(h * w) // w, torch.arange(h * w) % w
    same_row, same_col = ii[:, None] == ii[None], jj[:, None] == jj[None]

    if mod.mask == 'rmt':
        m = ref_manhattan_mask(decay, h, w)
    elif mod.mask == 'none':
        m = torch.zeros_like(s)
    else:
        pe = mod.path_embed
        la, lb = ref_decays(x, pe.dt_linear.weight, pe.A_log, pe.dt_bias, n)
        m = ref_v2h_mask(la, lb)

    def sm(bias, where=None):
        logits = s + bias
        if where is not None:
            logits = logits.masked_fill(~where, float('-inf'))
        return logits.softmax(-1)

    if mod.attn_type == 'whole':
        if mod.mask in ('polyline', 'shared'):
            if mod.form == 'paper':
                attn = s.softmax(-1) * (m.exp() + m.transpose(-1, -2).exp())
            else:
                attn = 0.5 * sm(m) + 0.5 * sm(m.transpose(-1, -2))
        else:  # v2h, rmt, none: one softmax with M
            attn = sm(m)
    else:
        # on a row / column the V2H mask is the 1D segment mask (and RMT's the 1D distance decay)
        aw, ah = sm(m, same_row), sm(m, same_col)
        if mod.mask == 'rmt':
            attn = ah @ aw  # rows first
        elif mod.mask == 'v2h':
            attn = aw @ ah  # down the key's column, then along the query's row
        else:
            attn = 0.5 * ah @ aw + 0.5 * aw @ ah
    if parts:
        return attn, m, s
    out = attn @ vf
    out = out.reshape(b, n, h, w, d).permute(0, 2, 3, 1, 4).reshape(b, h, w, c)
    return F.linear(out + lepe.permute(0, 2, 3, 1), mod.out_proj.weight, mod.out_proj.bias)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize('h,w', SHAPES)
def test_rope_matches_reference(h, w):
    d = 8
    rope = RasterRoPE2D(d, num_heads=2).double()
    tables = rope(h, w)
    x = torch.randn(2, 2, h, w, d, dtype=torch.float64)
    got = apply_rope(x, tables.sin.double(), tables.cos.double())
    torch.testing.assert_close(got, ref_rope(x), rtol=1e-5, atol=1e-5)
    assert rope.angle.shape == (d, )


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize('inplace', [False, True])
def test_rope_inference_paths_match_reference(dtype, inplace):
    """Without autograd: the complex product (contiguous float), the pair swap (other dtypes, strided x),
    in place or not, on tokens with the heads interleaved (tables broadcast over the head axis)."""
    h, w, heads, d = 3, 5, 2, 8
    tables = RasterRoPE2D(d, num_heads=heads).double()(h, w)
    sin, cos = tables.sin.to(dtype).unsqueeze(-2), tables.cos.to(dtype).unsqueeze(-2)
    tokens = torch.randn(2, h, w, heads, d, dtype=torch.float64)
    want = ref_rope(tokens.permute(0, 3, 1, 2, 4)).permute(0, 2, 3, 1, 4)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for x in (tokens.to(dtype), tokens.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)):
        before = x.clone()
        with torch.no_grad():
            got = apply_rope(x, sin, cos, inplace=inplace)
        torch.testing.assert_close(got.double(), want, **tol)
        assert (got.data_ptr() == x.data_ptr()) == inplace
        if not inplace:
            assert torch.equal(x, before)


def test_rmt_log_decay_values():
    # docs/method.md §6: log(1 - 2^(-2 - r*h/n)); e.g. n=4, r=4: h=0 -> log(3/4), h=2 -> log(1 - 2^-4)
    got = rmt_log_decay(4, 4)
    want = torch.tensor([math.log(1 - 2**(-2 - 4 * h / 4)) for h in range(4)])
    torch.testing.assert_close(got, want.float())
    assert (got < 0).all()


def test_path_embed_formula_and_shapes():
    pe = PathEmbed(num_heads=3, head_dims=4).double()
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64)
    la, lb = pe(x)
    assert la.shape == lb.shape == (2, 3, 3, 5)
    assert la.dtype == torch.float32
    want_a, want_b = ref_decays(x, pe.dt_linear.weight, pe.A_log, pe.dt_bias, 3)
    torch.testing.assert_close(la, want_a.float())
    torch.testing.assert_close(lb, want_b.float())
    assert (la <= 0).all() and (lb <= 0).all()
    shared = PathEmbed(num_heads=3, head_dims=4, directions=1)
    sa, sb = shared(x.float())
    assert sa is sb and shared.dt_linear.weight.shape == (1, 4)


def test_path_embed_init_distributions():
    """docs/method.md §1: A_log = log U(1, 1.1); dt_bias = softplus^-1(dt0), dt0 log-uniform in [1e-3, 1e-1]."""
    torch.manual_seed(0)
    pe = PathEmbed(num_heads=4096, head_dims=4)
    a = pe.A_log.detach().exp()
    assert a.min() >= 1.0 and a.max() <= 1.1
    assert abs(a.mean().item() - 1.05) < 0.005  # uniform mean
    dt = F.softplus(pe.dt_bias.detach().double())  # invert the inverse softplus
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4)
    log_dt = dt.log()
    lo, hi = math.log(1e-3), math.log(1e-1)
    assert abs(log_dt.mean().item() - (lo + hi) / 2) < 0.05  # log-uniform: uniform in log space
    assert abs(log_dt.std().item() - (hi - lo) / math.sqrt(12)) < 0.05


CASES = [('whole', 'polyline', 'release'), ('whole', 'polyline', 'paper'), ('whole', 'shared', 'release'),
         ('whole', 'v2h', 'release'), ('whole', 'rmt', 'release'), ('whole', 'none', 'release'),
         ('criss_cross', 'polyline', 'release'), ('criss_cross', 'shared', 'release'),
         ('criss_cross', 'v2h', 'release'), ('criss_cross', 'rmt', 'release'), ('criss_cross', 'none', 'release')]


@pytest.mark.parametrize('attn_type,mask,form', CASES)
@pytest.mark.parametrize('h,w', [(3, 5), (4, 1)])
def test_attention_module_matches_dense_reference(attn_type, mask, form, h, w):
    torch.manual_seed(0)
    c, n = 8, 2
    mod = PolylinePathAttention(c, n, attn_type=attn_type, mask=mask, form=form, impl='torch').double()
    for p in mod.parameters():  # larger weights so that masks and RoPE matter
        p.data.normal_(0, 0.5)
    if mod.path_embed is not None:
        mod.path_embed.A_log.data.uniform_(-1, 0.5)
    rope = RasterRoPE2D(c // n, n, heads_range=4 if mask == 'rmt' else None).double()
    x = torch.randn(2, h, w, c, dtype=torch.float64)
    got = mod(x, rope(h, w))
    want = ref_attention_module(mod, x, rope.decay)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('attn_type,mask,form', CASES)
def test_query_maps_match_the_dense_reference(attn_type, mask, form):
    torch.manual_seed(1)
    c, n, h, w = 8, 2, 3, 4
    mod = PolylinePathAttention(c, n, attn_type=attn_type, mask=mask, form=form, impl='torch').double()
    for p in mod.parameters():
        p.data.normal_(0, 0.5)
    rope = RasterRoPE2D(c // n, n, heads_range=4 if mask == 'rmt' else None).double()
    x = torch.randn(2, h, w, c, dtype=torch.float64)
    queries = [(0, 0), (1, 2), (2, 3)]
    maps = mod.query_maps(x, rope(h, w), queries)
    attn, m, s = ref_attention_module(mod, x, rope.decay, parts=True)
    rows = [i * w + j for i, j in queries]
    want_mask = m.exp() + m.transpose(-1, -2).exp() if mask in ('polyline', 'shared') else m.exp()
    for key, want in (('attention', attn), ('mask', want_mask), ('unmasked', s.softmax(-1))):
        assert maps[key].shape == (2, n, len(queries), h, w) and maps[key].dtype == torch.float32
        want = want.expand(2, -1, -1, -1)[:, :, rows].float()  # RMT's mask: one for the batch
        torch.testing.assert_close(maps[key].flatten(-2), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='outside the 3 x 4 token grid'):
        mod.query_maps(x, rope(h, w), [(3, 0)])


def test_attention_rejects_bad_choices():
    with pytest.raises(ValueError, match='mask'):
        PolylinePathAttention(8, 2, mask='hilbert')
    with pytest.raises(ValueError, match='attn_type'):
        PolylinePathAttention(8, 2, attn_type='local')
    with pytest.raises(ValueError, match='divisible'):
        PolylinePathAttention(10, 4)
