"""Plain flash-attention kernels (no mask, no bias): the baseline that ``tools/check_kernels.py --sass`` compiles
beside each of the ops' kernels, with the same tiles, warps, stages, dtype and target, to price what the mask adds
per score. They exist only to be compiled: nothing in ``mmppma`` launches them.

Both follow the usual flash form: scores in log2 units (the softmax scale times log2(e) applied once per tile,
``exp2``), the previous accumulator rescaled and passed to the next product as its initial value. The sequence is
taken as a multiple of the key block, as in Triton's tutorial: loads are masked by row as the ops' kernels mask
theirs, scores are not.
"""
import triton
import triton.language as tl


@triton.jit
def _tile(ptr, rows, row_mask, cols, ncols):
    return tl.load(ptr + rows[:, None] * ncols + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < ncols),
                   other=0.0)


@triton.jit
def _program(N, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """This program's (slice, block of BLOCK tokens): the slice index, the tokens and their mask, the head dims."""
    blocks = tl.cdiv(N, BLOCK)
    tokens = tl.program_id(0) % blocks * BLOCK + tl.arange(0, BLOCK)
    return ((tl.program_id(0) // blocks).to(tl.int64), tokens, tokens < N, tl.arange(0, BLOCK_D),
            tl.arange(0, BLOCK_DV))


@triton.jit
def _flash_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qk_scale, N, D, DV, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (slice, query block): softmax(q k^T * scale) v over all key blocks; lse in log2 units."""
    bh, rows, row_mask, dims, dims_v = _program(N, BLOCK_M, BLOCK_D, BLOCK_DV)
    q = _tile(q_ptr + bh * N * D, rows, row_mask, dims, D)
    m = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_mask = keys < N
        s = tl.dot(q, tl.trans(_tile(k_ptr + bh * N * D, keys, key_mask, dims, D)), input_precision=PRECISION)
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = _tile(v_ptr + bh * N * DV, keys, key_mask, dims_v, DV)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    tl.store(o_ptr + bh * N * DV + rows[:, None] * DV + dims_v[None, :], acc / l[:, None],
             mask=row_mask[:, None] & (dims_v[None, :] < DV))
    tl.store(lse_ptr + bh * N + rows, m + tl.math.log2(l), mask=row_mask)


@triton.jit
def _flash_bwd(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, qk_scale, N, D, DV,
               KEYS: tl.constexpr, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (slice, own block) of keys (KEYS: g1 = dk, g2 = dv) or queries (g1 = dq), looping over the
    other tokens; tiles are (own x other tokens) as in the ops' backward kernels. lse in log2 units, delta the
    row sums of dO * O."""
    bh, own, own_mask, dims, dims_v = _program(N, BLOCK_OWN, BLOCK_D, BLOCK_DV)
    q_ptr += bh * N * D
    k_ptr += bh * N * D
    v_ptr += bh * N * DV
    do_ptr += bh * N * DV
    lse_ptr += bh * N
    delta_ptr += bh * N
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_OWN, BLOCK_DV], tl.float32)
    if KEYS:
        a = _tile(k_ptr, own, own_mask, dims, D)
        da = _tile(v_ptr, own, own_mask, dims_v, DV)
        for start in range(0, N, BLOCK_OTHER):
            other = start + tl.arange(0, BLOCK_OTHER)
            other_mask = other < N
            q = _tile(q_ptr, other, other_mask, dims, D)
            do = _tile(do_ptr, other, other_mask, dims_v, DV)
            lse = tl.load(lse_ptr + other, mask=other_mask, other=0.0)
            delta = tl.load(delta_ptr + other, mask=other_mask, other=0.0)
            p = tl.math.exp2(tl.dot(a, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
            g2 = tl.dot(p.to(do.dtype), do, g2, input_precision=PRECISION)
            ds = p * (tl.dot(da, tl.trans(do), input_precision=PRECISION) - delta[None, :])
            g1 = tl.dot(ds.to(q.dtype), q, g1, input_precision=PRECISION)
    else:
        a = _tile(q_ptr, own, own_mask, dims, D)
        da = _tile(do_ptr, own, own_mask, dims_v, DV)
        lse = tl.load(lse_ptr + own, mask=own_mask, other=0.0)
        delta = tl.load(delta_ptr + own, mask=own_mask, other=0.0)
        for start in range(0, N, BLOCK_OTHER):
            other = start + tl.arange(0, BLOCK_OTHER)
            other_mask = other < N
            k = _tile(k_ptr, other, other_mask, dims, D)
            v = _tile(v_ptr, other, other_mask, dims_v, DV)
            p = tl.math.exp2(tl.dot(a, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
            ds = p * (tl.dot(da, tl.trans(v), input_precision=PRECISION) - delta[:, None])
            g1 = tl.dot(ds.to(k.dtype), k, g1, input_precision=PRECISION)
    tl.store(g1_ptr + bh * N * D + own[:, None] * D + dims[None, :], g1 * qk_scale,
             mask=own_mask[:, None] & (dims[None, :] < D))
    if KEYS:
        tl.store(g2_ptr + bh * N * DV + own[:, None] * DV + dims_v[None, :], g2,
                 mask=own_mask[:, None] & (dims_v[None, :] < DV))


def tiles(c: dict):
    """(own tokens, other tokens) per tile of a kernel with constexprs ``c``: a forward's query and key blocks, a
    backward's own and other blocks. Whole attention's kernels carry a tile per map (the image: BLOCK_V, its
    transpose: BLOCK_H); the first map the launch runs on gives the row's tile."""
    if 'BLOCK_V' in c:
        on_image = (c['V2H'] and not c.get('KEYS')) or (not c['V2H'] and c.get('KEYS'))
        own = c['BLOCK_V'] if on_image else c['BLOCK_H']
        return own, c.get('BLOCK_N', c.get('BLOCK_OTHER'))
    return c.get('BLOCK_M', c.get('BLOCK_OWN')), c.get('BLOCK_N', c.get('BLOCK_OTHER'))


def reference_desc(desc: dict) -> dict:
    """The compile description (as ``check_kernels.spec_key`` makes them) of the plain kernel to compare
    ``desc``'s kernel with: the backward with the same own / other blocks and role (keys or queries) for backward
    kernels (those with a KEYS constexpr), the forward for the others (the scan included); same dtype, head dims,
    warps, stages, target and divisibility of the sizes."""
    c = desc['constexprs']
    names = list(desc['signature'])
    divisible = {names[int(i)] for i in desc['attrs']}
    dtype = desc['signature']['q_ptr' if 'q_ptr' in desc['signature'] else 'x_ptr'].lstrip('*')
    block_d = c['BLOCK_D']
    block_dv = c.get('BLOCK_DV', c.get('BLOCK_X', block_d))
    pointers = {name: '*' + dtype for name in ('q_ptr', 'k_ptr', 'v_ptr')}
    scalars = dict(qk_scale='fp32', N='i32', D='i32', DV='i32')
    if 'KEYS' not in c:
        kernel = '_flash_fwd'
        signature = dict(pointers, o_ptr='*fp32', lse_ptr='*fp32', **scalars)
        constexprs = dict(zip(('BLOCK_M', 'BLOCK_N'), tiles(c)))
    else:
        kernel = '_flash_bwd'
        signature = dict(pointers, do_ptr='*' + dtype, lse_ptr='*fp32', delta_ptr='*fp32', g1_ptr='*fp32',
                         g2_ptr='*fp32', **scalars)
        constexprs = dict(KEYS=bool(c['KEYS']), **dict(zip(('BLOCK_OWN', 'BLOCK_OTHER'), tiles(c))))
    constexprs.update(BLOCK_D=block_d, BLOCK_DV=block_dv, PRECISION=c['PRECISION'])
    signature.update({name: 'constexpr' for name in constexprs})
    # pointers 16-byte aligned; the sizes divisible by 16 where the kernel's were (N: its token or line count)
    source = dict(N='N' if 'N' in names else 'L', D='D', DV=next(n for n in ('DV', 'DX', 'D') if n in names))
    attrs = {str(i): [['tt.divisibility', 16]] for i, name in enumerate(signature)
             if signature[name][0] == '*' or source.get(name) in divisible}
    return dict(kernel=kernel, module=__name__, signature=signature, attrs=attrs, constexprs=constexprs,
                options=desc['options'], arch=desc['arch'])
