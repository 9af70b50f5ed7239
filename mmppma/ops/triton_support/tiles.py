"""Jitted helpers shared by the Triton kernels: token blocks, tile loads and stores, 64-bit slice offsets, the
online softmax's start and the backward programs' operands.

Tiles: a (rows, cols) tile of a row-major (.., ncols) tensor, rows masked by ``row_mask``, columns beyond
``ncols`` (the padding up to the power-of-two block) by index."""
import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, rows, row_mask, cols, ncols):
    return tl.load(ptr + rows[:, None] * ncols + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < ncols),
                   other=0.0)


@triton.jit
def load_rows(ptr, offs, row_mask, cols, ncols):
    """Rows at element offsets ``offs`` (a strided tensor's tokens), channels ``cols`` contiguous."""
    return tl.load(ptr + offs[:, None] + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < ncols), other=0.0)


@triton.jit
def token_block(start, BLOCK: tl.constexpr, L, base, step):
    """Indices ``start .. start + BLOCK`` of a sequence of ``L`` tokens stored at ``base + index * step``:
    (indices, mask, token offsets)."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < L, base + offs * step


@triton.jit
def store_tile(ptr, rows, row_mask, cols, ncols, value):
    tl.store(ptr + rows[:, None] * ncols + cols[None, :], value, mask=row_mask[:, None] & (cols[None, :] < ncols))


@triton.jit
def slice_offset(index, n, d):
    """Element offset ``index * n * d`` of slice ``index`` of a (.., n, d) tensor, in int64: batch * heads * N * d
    passes 2**31 at large inputs."""
    return index.to(tl.int64) * n * d


@triton.jit
def head_offset(bh, heads, s_b, s_n):
    """Element offset, in int64, of slice ``bh`` (image * heads + head) of a (B, heads, ...) tensor with strides
    (s_b, s_n, ...)."""
    return (bh // heads).to(tl.int64) * s_b + (bh % heads).to(tl.int64) * s_n


@triton.jit
def online_softmax_start(BLOCK_M: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax's running row maximum, normalisers (:func:`add_normalisers`) and unnormalised output,
    before the first key block."""
    return (tl.full([BLOCK_M], float('-inf'), tl.float32),
            tl.zeros([BLOCK_M, 16 if PRECISION != 'ieee' else 1], tl.float32),
            tl.zeros([BLOCK_M, BLOCK_X], tl.float32))


@triton.jit
def add_normalisers(sums, p, alpha, PRECISION: tl.constexpr):
    """The online softmax's normalisers after a key block whose probabilities are ``p`` (in the dtype they
    multiply the values in), those before scaled by ``alpha``. With tensor-core products a product of P with ones
    (16 equal columns: no sum per score on the CUDA cores); with exact float32 products a sum per row (one
    column)."""
    if PRECISION != 'ieee':
        ones = tl.full([p.shape[1], 16], 1.0, tl.float32).to(p.dtype)  # (the interpreter builds no bf16 constant)
        return tl.dot(p, ones, sums * alpha[:, None], input_precision=PRECISION)
    return sums * alpha[:, None] + tl.sum(p, 1)[:, None]


@triton.jit
def table_parts(t, FIRST: tl.constexpr):
    """A (BLOCK, 16) bfloat16 tile of float32 entries ``t`` (BLOCK): columns FIRST to FIRST + 2 three bfloat16
    parts whose sum is ``t`` (to float32's precision), the others zero. A product of such a tile with a column of
    signs in those columns adds the entries to scores on the tensor cores."""
    hi = t.to(tl.bfloat16).to(tl.float32)
    mid = (t - hi).to(tl.bfloat16).to(tl.float32)
    lo = t - hi - mid
    col = tl.arange(0, 16)[None, :] - FIRST
    return tl.where(col == 0, hi[:, None], tl.where(col == 1, mid[:, None], tl.where(col == 2, lo[:, None], 0.0))
                    ).to(tl.bfloat16)


@triton.jit
def normalisers(sums):
    """Each row's normaliser from :func:`add_normalisers`' columns."""
    return tl.max(sums, 1)


@triton.jit
def row_sums_start(BLOCK: tl.constexpr, BY_DOT: tl.constexpr):
    """Running row sums of BLOCK rows (:func:`add_row_sums`), zero."""
    return tl.zeros([BLOCK, 16 if BY_DOT else 1], tl.float32)


@triton.jit
def add_row_sums(sums, x, SIGN: tl.constexpr, BY_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """``sums`` plus SIGN times the row sums of ``x``. BY_DOT: x in the products' input dtype, summed by a product
    with a column of SIGN (16 equal columns: no sum per element on the CUDA cores, as :func:`add_normalisers`);
    else a sum per row."""
    if BY_DOT:
        ones = tl.full([x.shape[1], 16], SIGN, tl.float32).to(x.dtype)
        return tl.dot(x, ones, sums, input_precision=PRECISION)
    return sums + (tl.sum(x, 1) * SIGN)[:, None]


@triton.jit
def row_sums(sums):
    """The row sums from :func:`add_row_sums`' columns (equal where there are 16)."""
    return tl.max(sums, 1)


@triton.jit
def bwd_operands(q_ptr, k_ptr, v_ptr, do_ptr, rows, row_mask, offs_d, D, offs_v, DV, KEYS: tl.constexpr):
    """A backward program's own tiles and the other tokens' tensors: scores S = a b^T and dP = da db^T on tiles of
    (own x other tokens). A program of keys holds a = k, da = v and reads b from q, db from do; one of queries the
    reverse. Returns (a, da, b_ptr, db_ptr)."""
    if KEYS:
        a = load_tile(k_ptr, rows, row_mask, offs_d, D)
        da = load_tile(v_ptr, rows, row_mask, offs_v, DV)
        b_ptr, db_ptr = q_ptr, do_ptr
    else:
        a = load_tile(q_ptr, rows, row_mask, offs_d, D)
        da = load_tile(do_ptr, rows, row_mask, offs_v, DV)
        b_ptr, db_ptr = k_ptr, v_ptr
    return a, da, b_ptr, db_ptr
