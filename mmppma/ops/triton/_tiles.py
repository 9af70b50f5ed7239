"""Tile loads and stores shared by the Triton kernels: a (rows, cols) tile of a row-major (.., ncols) tensor,
rows masked by ``row_mask``, columns beyond ``ncols`` (the padding up to the power-of-two block) by index."""
import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, rows, row_mask, cols, ncols):
    return tl.load(ptr + rows[:, None] * ncols + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < ncols),
                   other=0.0)


@triton.jit
def store_tile(ptr, rows, row_mask, cols, ncols, value):
    tl.store(ptr + rows[:, None] * ncols + cols[None, :], value, mask=row_mask[:, None] & (cols[None, :] < ncols))
