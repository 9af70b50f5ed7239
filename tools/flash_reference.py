"""Plain flash-attention kernels (no mask, no bias): the baseline that ``tools/check_kernels.py --sass`` compiles
beside each of the ops' kernels, with the same tiles, warps, stages, dtype and target, to price what the mask adds
per score. They exist only to be compiled and checked: nothing in ``mmppma`` launches them.

They take the lean form of Triton's fused-attention tutorial: scores in log2 units (``exp2``; the forward scales
them once per score, the backward takes K already scaled by the softmax scale times log2(e)), lse and delta
computed before the backward, tiles reached by pointer increments, and the head dims a power of two (no masks on
them). ``RAGGED`` is the variant for a sequence that is not a multiple of the other block: its loads are masked,
and so are the scores of the other tokens past the end. Without it the loop has no mask at all.
"""
import triton
import triton.language as tl


@triton.jit
def _program(N, BLOCK: tl.constexpr):
    """This program's (slice, block of BLOCK tokens): the slice index and the tokens."""
    blocks = tl.cdiv(N, BLOCK)
    return (tl.program_id(0) // blocks).to(tl.int64), tl.program_id(0) % blocks * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _flash_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qk_scale, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, RAGGED: tl.constexpr):
    """One program per (slice, query block): softmax(q k^T * scale) v over all key blocks; lse in log2 units.
    q, k (slices, N, BLOCK_D) and v, o (slices, N, BLOCK_DV) contiguous."""
    bh, rows = _program(N, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    keys = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + bh * N * BLOCK_D + rows[:, None] * BLOCK_D + dims[None, :], mask=rows[:, None] < N,
                other=0.0)
    kt_ptrs = k_ptr + bh * N * BLOCK_D + keys[None, :] * BLOCK_D + dims[:, None]  # K^T: (dims, keys)
    v_ptrs = v_ptr + bh * N * BLOCK_DV + keys[:, None] * BLOCK_DV + dims_v[None, :]
    m = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(0, N, BLOCK_N):
        if RAGGED:
            in_seq = start + keys < N
            s = tl.dot(q, tl.load(kt_ptrs, mask=in_seq[None, :], other=0.0), input_precision=PRECISION)
            s = tl.where(in_seq[None, :], s, float('-inf'))
            v = tl.load(v_ptrs, mask=in_seq[:, None], other=0.0)
        else:
            s = tl.dot(q, tl.load(kt_ptrs), input_precision=PRECISION)
            v = tl.load(v_ptrs)
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
        kt_ptrs += BLOCK_N * BLOCK_D
        v_ptrs += BLOCK_N * BLOCK_DV
    tl.store(o_ptr + bh * N * BLOCK_DV + rows[:, None] * BLOCK_DV + dims_v[None, :], acc / l[:, None],
             mask=rows[:, None] < N)
    tl.store(lse_ptr + bh * N + rows, m + tl.math.log2(l), mask=rows < N)


@triton.jit
def _flash_bwd(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, g1_scale, N, KEYS: tl.constexpr,
               BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               PRECISION: tl.constexpr, RAGGED: tl.constexpr):
    """One program per (slice, own block) of keys (KEYS: g1 = dk, g2 = dv) or queries (g1 = dq), looping over the
    other tokens; tiles are (own x other tokens) as in the ops' backward kernels. k comes scaled by the softmax
    scale times log2(e); g1 is multiplied by ``g1_scale`` once at the end (dk: the softmax scale; dq: ln 2). lse in
    log2 units, delta the row sums of dO * O. Layouts as :func:`_flash_fwd`'s."""
    bh, own = _program(N, BLOCK_OWN)
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    other = tl.arange(0, BLOCK_OTHER)
    own_d = bh * N * BLOCK_D + own[:, None] * BLOCK_D + dims[None, :]
    own_dv = bh * N * BLOCK_DV + own[:, None] * BLOCK_DV + dims_v[None, :]
    own_mask = own[:, None] < N
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    if KEYS:
        g2 = tl.zeros([BLOCK_OWN, BLOCK_DV], tl.float32)
        k = tl.load(k_ptr + own_d, mask=own_mask, other=0.0)
        v = tl.load(v_ptr + own_dv, mask=own_mask, other=0.0)
        qt_ptrs = q_ptr + bh * N * BLOCK_D + other[None, :] * BLOCK_D + dims[:, None]  # Q^T: (dims, queries)
        do_ptrs = do_ptr + bh * N * BLOCK_DV + other[:, None] * BLOCK_DV + dims_v[None, :]
        lse_ptrs = lse_ptr + bh * N + other
        delta_ptrs = delta_ptr + bh * N + other
        for start in range(0, N, BLOCK_OTHER):
            if RAGGED:
                in_seq = start + other < N
                qt = tl.load(qt_ptrs, mask=in_seq[None, :], other=0.0)
                lse = tl.load(lse_ptrs, mask=in_seq, other=float('inf'))  # queries past the end: P = 0
                do = tl.load(do_ptrs, mask=in_seq[:, None], other=0.0)
                delta = tl.load(delta_ptrs, mask=in_seq, other=0.0)
            else:
                qt = tl.load(qt_ptrs)
                lse = tl.load(lse_ptrs)
                do = tl.load(do_ptrs)
                delta = tl.load(delta_ptrs)
            pt = tl.math.exp2(tl.dot(k, qt, input_precision=PRECISION) - lse[None, :])
            g2 = tl.dot(pt.to(do.dtype), do, g2, input_precision=PRECISION)
            dst = pt * (tl.dot(v, tl.trans(do), input_precision=PRECISION) - delta[None, :])
            g1 = tl.dot(dst.to(qt.dtype), tl.trans(qt), g1, input_precision=PRECISION)
            qt_ptrs += BLOCK_OTHER * BLOCK_D
            do_ptrs += BLOCK_OTHER * BLOCK_DV
            lse_ptrs += BLOCK_OTHER
            delta_ptrs += BLOCK_OTHER
        tl.store(g2_ptr + own_dv, g2, mask=own_mask)
    else:
        q = tl.load(q_ptr + own_d, mask=own_mask, other=0.0)
        do = tl.load(do_ptr + own_dv, mask=own_mask, other=0.0)
        lse = tl.load(lse_ptr + bh * N + own, mask=own < N, other=0.0)
        delta = tl.load(delta_ptr + bh * N + own, mask=own < N, other=0.0)
        kt_ptrs = k_ptr + bh * N * BLOCK_D + other[None, :] * BLOCK_D + dims[:, None]
        vt_ptrs = v_ptr + bh * N * BLOCK_DV + other[None, :] * BLOCK_DV + dims_v[:, None]
        for start in range(0, N, BLOCK_OTHER):
            if RAGGED:
                in_seq = start + other < N
                kt = tl.load(kt_ptrs, mask=in_seq[None, :], other=0.0)
                vt = tl.load(vt_ptrs, mask=in_seq[None, :], other=0.0)
                p = tl.where(in_seq[None, :], tl.math.exp2(tl.dot(q, kt, input_precision=PRECISION) - lse[:, None]),
                             0.0)
            else:
                kt = tl.load(kt_ptrs)
                vt = tl.load(vt_ptrs)
                p = tl.math.exp2(tl.dot(q, kt, input_precision=PRECISION) - lse[:, None])
            ds = p * (tl.dot(do, vt, input_precision=PRECISION) - delta[:, None])
            g1 = tl.dot(ds.to(kt.dtype), tl.trans(kt), g1, input_precision=PRECISION)
            kt_ptrs += BLOCK_OTHER * BLOCK_D
            vt_ptrs += BLOCK_OTHER * BLOCK_DV
    tl.store(g1_ptr + own_d, g1 * g1_scale, mask=own_mask)


def tiles(c: dict):
    """(own tokens, other tokens) per tile of a kernel with constexprs ``c``: a forward's query and key blocks, a
    backward's own and other blocks. Whole attention's kernels carry a tile per map (the image: BLOCK_V, its
    transpose: BLOCK_H); the first map the launch runs on gives the row's tile."""
    if 'BLOCK_V' in c:
        on_image = (c['V2H'] and not c.get('KEYS')) or (not c['V2H'] and c.get('KEYS'))
        own = c['BLOCK_V'] if on_image else c['BLOCK_H']
        return own, c.get('BLOCK_N', c.get('BLOCK_OTHER'))
    return c.get('BLOCK_M', c.get('BLOCK_OWN')), c.get('BLOCK_N', c.get('BLOCK_OTHER'))


def reference_desc(desc: dict, ragged: bool) -> dict:
    """The compile description (as ``check_kernels.spec_key`` makes them) of the plain kernel to compare
    ``desc``'s kernel with: the backward with the same own / other blocks and role (keys or queries) for backward
    kernels (those with a KEYS constexpr), the forward for the others (the scan included); same dtype, head dims,
    warps, stages and target; ``ragged``: the masked variant (see the module's doc)."""
    c = desc['constexprs']
    names = list(desc['signature'])
    divisible = {names[int(i)] for i in desc['attrs']}
    dtype = desc['signature']['q_ptr' if 'q_ptr' in desc['signature'] else 'x_ptr'].lstrip('*')
    block_d = c['BLOCK_D']
    block_dv = c.get('BLOCK_DV', c.get('BLOCK_X', block_d))
    pointers = {name: '*' + dtype for name in ('q_ptr', 'k_ptr', 'v_ptr')}
    scalars = dict(qk_scale='fp32', N='i32')
    if 'KEYS' not in c:
        kernel = '_flash_fwd'
        signature = dict(pointers, o_ptr='*fp32', lse_ptr='*fp32', **scalars)
        constexprs = dict(zip(('BLOCK_M', 'BLOCK_N'), tiles(c)))
    else:
        kernel = '_flash_bwd'
        signature = dict(pointers, do_ptr='*' + dtype, lse_ptr='*fp32', delta_ptr='*fp32', g1_ptr='*fp32',
                         g2_ptr='*fp32', g1_scale='fp32', N='i32')
        constexprs = dict(KEYS=bool(c['KEYS']), **dict(zip(('BLOCK_OWN', 'BLOCK_OTHER'), tiles(c))))
    constexprs.update(BLOCK_D=block_d, BLOCK_DV=block_dv, PRECISION=c['PRECISION'], RAGGED=bool(ragged))
    signature.update({name: 'constexpr' for name in constexprs})
    # pointers 16-byte aligned; N divisible by 16 where it is a multiple of the blocks, else where the kernel's
    # token or line count was
    n_divisible = not ragged or ('N' if 'N' in names else 'L') in divisible
    attrs = {str(i): [['tt.divisibility', 16]] for i, name in enumerate(signature)
             if signature[name][0] == '*' or (name == 'N' and n_divisible)}
    return dict(kernel=kernel, module=__name__, signature=signature, attrs=attrs, constexprs=constexprs,
                options=desc['options'], arch=desc['arch'])
