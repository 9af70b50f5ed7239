"""tools/flash_reference.py: the plain flash kernels that check_kernels prices the ops' key loops against compute
flash attention (on the interpreter, against autograd in float64), with and without the ragged variant's masks."""
import math

import pytest
import torch

from .conftest import load_tool

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
flash = load_tool('flash_reference.py')
LOG2E = 1 / math.log(2)


@pytest.mark.parametrize('n, ragged', [(32, False), (40, True)])
def test_plain_flash_kernels_compute_attention_and_its_gradients(n, ragged):
    """Two slices of n tokens, d = dv = 16, blocks of 16: the forward's output and lse, the keys' (dk, dv) and the
    queries' (dq) programs, against softmax(q k^T / sqrt(d)) v and its autograd gradients in float64."""
    torch.manual_seed(0)
    slices, d, block = 2, 16, 16
    q, k, v, do = (torch.randn(slices, n, d, dtype=torch.float64) for _ in range(4))
    scale = d**-0.5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    p = torch.softmax(leaves[0] @ leaves[1].transpose(-1, -2) * scale, -1)
    out = p @ leaves[2]
    out.backward(do)
    f32 = [t.float().contiguous() for t in (q, k, v, do)]
    o = torch.empty(slices, n, d)
    lse = torch.empty(slices, n)
    qk_scale = scale * LOG2E
    grid = (slices * -(-n // block), )
    common = dict(BLOCK_D=d, BLOCK_DV=d, PRECISION='ieee', RAGGED=ragged)
    flash._flash_fwd[grid](*f32[:3], o, lse, qk_scale, n, BLOCK_M=block, BLOCK_N=block, **common)
    torch.testing.assert_close(o.double(), out.detach(), atol=1e-5, rtol=1e-5)
    expected_lse = torch.logsumexp(q @ k.transpose(-1, -2) * scale, -1) * LOG2E
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-5, rtol=1e-5)
    delta = (f32[3] * o).sum(-1)
    k_scaled = (f32[1] * qk_scale).contiguous()  # the backward takes K scaled (the tutorial's form)
    dq, dk, dv = (torch.zeros(slices, n, d) for _ in range(3))
    args = (f32[0], k_scaled, f32[2], f32[3], lse, delta)
    flash._flash_bwd[grid](*args, dk, dv, scale, n, KEYS=True, BLOCK_OWN=block, BLOCK_OTHER=block, **common)
    flash._flash_bwd[grid](*args, dq, dq, 1 / LOG2E, n, KEYS=False, BLOCK_OWN=block, BLOCK_OTHER=block, **common)
    for got, leaf in zip((dq, dk, dv), leaves):
        torch.testing.assert_close(got.double(), leaf.grad, atol=1e-4, rtol=1e-4)
