"""speclm's Triton GEMM (kernels/triton_gemm.py) on the GPU: against an fp32 product, each row's result
bit for bit the same whatever rows share the call, and the linears of a GPU model going through it."""

from __future__ import annotations

import pytest
import torch

from speclm.models.linear import BATCH_INVARIANT_ROWS, Linear, dense_kernel
from tests.cuda.conftest import DEVICE, needs_cuda

pytestmark = needs_cuda

# (out, in): split along K and not, shapes on and off the blocks, the 1.5B's qkv and down projections
SHAPES = [(2048, 1536), (1536, 8960), (8192, 512), (1000, 1000), (96, 172), (17, 64)]


def operands(n, k, dtype, bias, rows=40, seed=0):
    g = torch.Generator().manual_seed(seed + n + k)
    x = torch.randn(rows, k, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_matches_an_fp32_product(dtype, n, k, bias):
    from speclm.kernels.triton_gemm import linear

    x, w, b = operands(n, k, dtype, bias)
    expected = x.float() @ w.float().T + (b.float() if bias else 0.0)
    got = linear(x, w, b)
    assert got.dtype == dtype and got.shape == (len(x), n)
    err = (got.float() - expected).abs().max().item() / expected.abs().max().item()
    assert err <= (1e-2 if dtype == torch.bfloat16 else 2e-3), err


@pytest.mark.parametrize("n,k", SHAPES)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(n, k):
    from speclm.kernels.triton_gemm import linear

    x, w, b = operands(n, k, torch.bfloat16, True)
    together = linear(x, w, b)  # 40 rows: two row blocks
    for rows in (1, 2, 5, 32, 33):
        assert torch.equal(linear(x[:rows], w, b), together[:rows]), rows
    assert torch.equal(linear(x[7:8], w, b), together[7:8])


def test_a_gpu_models_linear_runs_the_kernel_for_a_few_rows_and_cublas_beyond():
    from speclm.kernels.triton_gemm import linear

    layer = Linear(1536, 2048, bias=True).to(DEVICE, torch.bfloat16).requires_grad_(False)
    op = dense_kernel(layer.weight, layer.bias)
    x = torch.randn(BATCH_INVARIANT_ROWS + 8, 1536, device=DEVICE, dtype=torch.bfloat16)
    few = x[:BATCH_INVARIANT_ROWS]
    assert torch.equal(op(few), linear(few, layer.weight, layer.bias))
    assert torch.equal(op(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
