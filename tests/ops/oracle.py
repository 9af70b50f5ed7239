"""Independent float64 oracles, written from the definitions with explicit loops (numpy).

They share no code with mmppma.ops: a path's log-decay is summed term by term along the path
(docs/method.md §2: the segment from s to t sums the log-decays strictly after min(s, t) up to max(s, t)).
"""
import numpy as np


def seg(line, s, t):
    lo, hi = min(s, t), max(s, t)
    return line[lo + 1:hi + 1].sum()


def mask_v2h(la, lb):
    """la, lb: (H, W) -> (N, N) log-mask, query (i, j) -> key (k, l): row i from j to l, then column l."""
    return np.array([[seg(la[i, :], j, l) + seg(lb[:, l], i, k) for k, l in np.ndindex(la.shape)]
                     for i, j in np.ndindex(la.shape)])


def mask_3d(la, lb, lc):
    """la, lb, lc: (D, H, W) -> (N, N): along W in the query's row, along H at the key's column, along D."""
    return np.array([[seg(la[i, j, :], k, nn) + seg(lb[i, :, nn], j, mm) + seg(lc[:, mm, nn], i, l)
                      for l, mm, nn in np.ndindex(la.shape)] for i, j, k in np.ndindex(la.shape)])


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def whole_attention(q, k, v, la, lb, scale, form):
    """q, k, v: (H, W, d) for one batch item and head; la, lb: (H, W). -> (H, W, d_v)."""
    h, w, _ = q.shape
    qf, kf, vf = q.reshape(h * w, -1), k.reshape(h * w, -1), v.reshape(h * w, -1)
    s = scale * qf @ kf.T
    m = mask_v2h(la, lb)
    if form == 'release':
        a = 0.5 * softmax(s + m) + 0.5 * softmax(s + m.T)
    elif form == 'paper':
        a = softmax(s) * (np.exp(m) + np.exp(m.T))
    elif form == 'v2h':
        a = softmax(s + m)
    else:
        a = softmax(s + m.T)
    return (a @ vf).reshape(h, w, -1)


def criss_cross(q, k, v, la, lb, scale, form):
    """Loops over rows and columns: Aw per row, Ah per column, composed in the order of ``form``."""
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

    if form == 'h2v':
        return cols(rows(v))
    if form == 'v2h':
        return rows(cols(v))
    return 0.5 * cols(rows(v)) + 0.5 * rows(cols(v))


def manhattan_mask(gamma, h, w):
    """(N, N): gamma times the Manhattan distance |i - k| + |j - l| between (i, j) and (k, l)."""
    return np.array([[gamma * (abs(i - k) + abs(j - l)) for k, l in np.ndindex(h, w)] for i, j in np.ndindex(h, w)])


def apply_per_head(fn, *arrays, **kwargs):
    """Run a per-(batch, head) oracle over leading (B, heads) dims of numpy arrays."""
    b, heads = arrays[0].shape[:2]
    outs = [[fn(*(a[bi, hi] for a in arrays), **kwargs) for hi in range(heads)] for bi in range(b)]
    return np.stack([np.stack(o) for o in outs])
