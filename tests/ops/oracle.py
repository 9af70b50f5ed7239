"""Independent float64 oracles written from the definitions with explicit loops (numpy; torch where their gradients
are checked), sharing no code with mmppma.ops (a segment from s to t sums the log-decays strictly after min(s, t)
up to max(s, t), docs/method.md §2); the tests' input makers, gradient and graph checks and TF32 switch."""
import contextlib

import numpy as np
import torch


def seg(line, s, t):
    return line[min(s, t) + 1:max(s, t) + 1].sum()


def mask_v2h(la, lb):
    """la, lb: (H, W) -> (N, N) log-mask, query (i, j) -> key (k, l): row i from j to l, then column l."""
    return np.array([[seg(la[i, :], j, l) + seg(lb[:, l], i, k) for k, l in np.ndindex(la.shape)]
                     for i, j in np.ndindex(la.shape)])


def mask_3d(la, lb, lc):
    """la, lb, lc: (D, H, W) -> (N, N): along W in the query's row, along H at the key's column, along D."""
    return np.array([[seg(la[i, j, :], k, nn) + seg(lb[i, :, nn], j, mm) + seg(lc[:, mm, nn], i, l)
                      for l, mm, nn in np.ndindex(la.shape)] for i, j, k in np.ndindex(la.shape)])


def mask_v2h_torch(la, lb):
    """:func:`mask_v2h` on (H, W) float64 tensors, differentiable: the oracle of gradients."""
    h, w = la.shape
    return torch.stack([torch.stack([seg(la[i], j, l) + seg(lb[:, l], i, k) for k, l in np.ndindex(h, w)])
                        for i, j in np.ndindex(h, w)])


def masked_linear(q, k, v, la, lb, *normalizer, form, feature, normalize, eps=1e-6):
    """((phi(q) phi(k)^T) * L) v per (batch, head) of (B, heads, H, W, .) tensors, divided by
    ((phi(q') phi(k')^T) * L) 1 + eps if ``normalize`` (q', k': ``normalizer``, default q, k); differentiable.
    ``feature``: 'elu' (elu + 1) or 'identity'; ``form``: 'v2h' (L), 'h2v' (L^T), '2d' (L + L^T)."""
    def phi(x):
        return torch.nn.functional.elu(x) + 1 if feature == 'elu' else x

    b, heads, h, w, _ = q.shape
    out = []
    for bi in range(b):
        for hi in range(heads):
            m = mask_v2h_torch(la[bi, hi], lb[bi, hi])
            mask = {'v2h': m.exp(), 'h2v': m.T.exp(), '2d': m.exp() + m.T.exp()}[form]

            def attn(x, y):
                return (phi(x[bi, hi].reshape(h * w, -1)) @ phi(y[bi, hi].reshape(h * w, -1)).T) * mask
            o = attn(q, k) @ v[bi, hi].reshape(h * w, -1)
            if normalize:
                o = o / (attn(*(normalizer or (q, k))).sum(-1, keepdim=True) + eps)
            out.append(o.reshape(h, w, -1))
    return torch.stack(out).reshape(*v.shape)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def whole_attention(q, k, v, la, lb, scale, form):
    """q, k, v: (H, W, d) of one batch item and head; la, lb: (H, W) -> (H, W, d_v)."""
    h, w, _ = q.shape
    qf, kf, vf = q.reshape(h * w, -1), k.reshape(h * w, -1), v.reshape(h * w, -1)
    s, m = scale * qf @ kf.T, mask_v2h(la, lb)
    a = {'release': lambda: 0.5 * softmax(s + m) + 0.5 * softmax(s + m.T),
         'paper': lambda: softmax(s) * (np.exp(m) + np.exp(m.T)),
         'v2h': lambda: softmax(s + m), 'h2v': lambda: softmax(s + m.T)}[form]()
    return (a @ vf).reshape(h, w, -1)


def criss_cross(q, k, v, la, lb, scale, form):
    """Loops over rows and columns: Aw per row, Ah per column; 'h2v' rows first, 'v2h' columns first."""
    h, w, _ = q.shape

    def rows(x):
        out = np.zeros((h, w, x.shape[-1]))
        for i in range(h):
            bias = np.array([[seg(la[i], j, l) for l in range(w)] for j in range(w)])
            out[i] = softmax(scale * q[i] @ k[i].T + bias) @ x[i]
        return out

    def cols(x):
        out = np.zeros((h, w, x.shape[-1]))
        for j in range(w):
            bias = np.array([[seg(lb[:, j], i, kk) for kk in range(h)] for i in range(h)])
            out[:, j] = softmax(scale * q[:, j] @ k[:, j].T + bias) @ x[:, j]
        return out

    return {'h2v': lambda: cols(rows(v)), 'v2h': lambda: rows(cols(v)),
            'release': lambda: 0.5 * cols(rows(v)) + 0.5 * rows(cols(v))}[form]()


def manhattan_mask(log_decay, h, w):
    """(N, N): log_decay times the Manhattan distance |i - k| + |j - l| between (i, j) and (k, l)."""
    return np.array([[log_decay * (abs(i - k) + abs(j - l)) for k, l in np.ndindex(h, w)]
                     for i, j in np.ndindex(h, w)])


def apply_per_head(fn, *arrays, **kwargs):
    """Run a per-(batch, head) oracle over leading (B, heads) dims of numpy arrays."""
    return np.stack([np.stack([fn(*(a[bi, hi] for a in arrays), **kwargs) for hi in range(arrays[0].shape[1])])
                     for bi in range(arrays[0].shape[0])])


def qkv(b, heads, h, w, d, seed=0, dtype=torch.float64, dv=None):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, heads, h, w, n, generator=g, dtype=dtype) for n in (d, d, dv or d)]


def decays(b, heads, h, w, seed=0, scale=1.0, offset=0.0, dtype=torch.float64):
    """la, lb in [-(offset + scale), -offset]."""
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(b, heads, h, w, generator=g, dtype=dtype) * scale + offset) for _ in 'ab']


def inputs(b, heads, h, w, d, seed=0, dtype=torch.float64, dv=None):
    """q, k, v (``seed``) and la, lb (``seed + 1``)."""
    return qkv(b, heads, h, w, d, seed, dtype, dv) + decays(b, heads, h, w, seed + 1, dtype=dtype)


def leaf(*ts):
    return [t.clone().requires_grad_() for t in ts]


def out_and_grads(fn, leaves):
    """fn(*leaves) and its leaves' gradients (zeros where unused) of the sum of linspace(-1, 1) times it."""
    out = fn(*leaves)
    cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    grads = torch.autograd.grad(out, leaves, cotangent, allow_unused=True)
    return [out.detach()] + [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def graph_code(fn, *args):
    """The code of the graphs dynamo traces from ``fn(*args)``, asserting that there is no graph break."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    return '\n'.join(graph.code for graph in explained.graphs)


def set_tf32(api, on):
    """TF32 for CUDA float32 matmuls on / off through the legacy flag ('allow_tf32'), the matmul's fp32_precision
    ('matmul') or every backend's default, which matmul inherits while its own is 'none' ('generic')."""
    matmul = torch.backends.cuda.matmul
    if api == 'allow_tf32':
        matmul.allow_tf32 = on
    elif api == 'matmul':
        matmul.fp32_precision = 'tf32' if on else 'ieee'
    else:
        matmul.fp32_precision, torch.backends.fp32_precision = 'none', 'tf32' if on else 'ieee'


@contextlib.contextmanager
def tf32(on=None, api='allow_tf32'):
    """``set_tf32(api, on)`` unless ``on`` is None, torch's settings restored on exit (through fp32_precision where
    torch has it: once that was set, reading the legacy flag raises)."""
    matmul, new_api = torch.backends.cuda.matmul, hasattr(torch.backends, 'fp32_precision')
    saved = (torch.backends.fp32_precision, matmul.fp32_precision) if new_api else matmul.allow_tf32
    if on is not None:
        set_tf32(api, on)
    try:
        yield
    finally:
        if new_api:
            torch.backends.fp32_precision, matmul.fp32_precision = saved
        else:
            matmul.allow_tf32 = saved
