"""The Triton kernels (paged attention, RMSNorm alone and after the residual add, the SwiGLU product)
against their torch references, in Triton's interpreter on the CPU (TRITON_INTERPRET=1, in a subprocess so
that no other test sees the setting). Skipped where Triton is not installed (CI); on a GPU
tests/cuda/test_cuda_attention.py runs the compiled kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

PATCH = textwrap.dedent(
    """
    import numpy as np
    import torch
    import triton.runtime.interpreter as interpreter

    # Triton 3.6's interpreter turns a loaded scalar into a loop bound with int() of a 1-element
    # array, which numpy 2 refuses; the compiled kernel has no such step.
    _patch = interpreter._patch_lang_tensor

    def _patched(tensor, scope):
        _patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    interpreter._patch_lang_tensor = _patched
    """
)
SCRIPT = PATCH + textwrap.dedent(
    """
    from speclm.kernels.triton_attention import paged_attention
    from speclm.models.gpu_attention import attend_rows_reference

    # (bf16 is left to the GPU test: the interpreter computes through numpy, which has no bf16.)
    g = torch.Generator().manual_seed(0)
    for heads, kv, d, dtype in [(4, 2, 8, torch.float32), (6, 2, 64, torch.float32), (9, 3, 64, torch.float16),
                                (3, 3, 32, torch.float32), (7, 1, 16, torch.float32)]:
        q = torch.randn(heads, 5, d, generator=g).to(dtype)
        keys, values = (torch.randn(kv, 300, d, generator=g).to(dtype) for _ in range(2))
        lengths = torch.tensor([1, 17, 64, 65, 130])
        table = torch.stack([torch.randperm(300, generator=g)[:140] for _ in range(3)])
        table_rows = torch.tensor([0, 1, 2, 1, 0])
        args = (q, keys, values, lengths, table, table_rows, d**-0.5)
        for window in (None, 1, 20, 64):  # (a sliding-window layer's rows: their last `window` keys)
            expected, got = attend_rows_reference(*args, window), paged_attention(*args, window)
            tol = 1e-2 if dtype == torch.float16 else 1e-5
            err = (expected.float() - got.float()).abs().max().item()
            assert err <= tol, (heads, kv, d, dtype, window, err)
    print("ok")
    """
)


OPS_SCRIPT = PATCH + textwrap.dedent(
    """
    import torch.nn.functional as F
    from speclm.kernels.triton_ops import add_rms_norm, argmax_rows, rms_norm, rope_write, silu_mul
    from speclm.models.rope import apply_rope

    g = torch.Generator().manual_seed(0)
    for cols, x_dtype, w_dtype in [(64, torch.float32, torch.float32), (96, torch.float16, torch.float16),
                                   (1536, torch.float32, torch.float16), (40, torch.float16, torch.float32)]:
        x = (3 * torch.randn(5, cols, generator=g)).to(x_dtype)
        w = torch.randn(cols, generator=g).to(w_dtype)
        normed = torch.rms_norm(x.float(), (cols,), eps=1e-6)
        expected = w * (normed if w_dtype == torch.float32 else normed.to(w_dtype))
        got = rms_norm(x, w, 1e-6)
        assert got.dtype == w_dtype and got.shape == x.shape
        tol = 2e-3 if w_dtype == torch.float16 else 1e-5
        err = ((got.float() - expected.float()).abs() / (1 + expected.float().abs())).max().item()
        assert err <= tol, (cols, x_dtype, w_dtype, err)
        assert torch.equal(rms_norm(x[2:3], w, 1e-6), got[2:3])  # a row alone: the same bits
        delta = torch.randn(5, cols, generator=g).to(x_dtype)
        total, normed = add_rms_norm(x, delta, w, 1e-6)  # the residual add fused: the two ops' bits
        assert torch.equal(total, x + delta) and torch.equal(normed, rms_norm(x + delta, w, 1e-6))
    for cols, dtype in [(8, torch.float32), (1500, torch.float32), (2100, torch.float16)]:
        gate_up = (2 * torch.randn(3, 2 * cols, generator=g)).to(dtype)
        gate, up = gate_up.float().split(cols, dim=-1)
        expected = F.silu(gate) * up
        got = silu_mul(gate_up)
        assert got.dtype == dtype and got.shape == (3, cols)
        tol = 4e-3 if dtype == torch.float16 else 1e-5
        err = ((got.float() - expected).abs() / (1 + expected.abs())).max().item()
        assert err <= tol, (cols, dtype, err)
    for heads, kv, d, dtype in [(4, 2, 8, torch.float32), (6, 3, 64, torch.float16), (2, 2, 16, torch.float32)]:
        n, pool = 5, 40
        qkv = torch.randn(n, (heads + 2 * kv) * d, generator=g).to(dtype)
        cos, sin = (torch.randn(n, d, generator=g).to(dtype) for _ in range(2))
        slots = torch.randperm(pool, generator=g)[:n]
        k_cache, v_cache = (torch.randn(kv, pool, d, generator=g).to(dtype) for _ in range(2))
        k_expected, v_expected = k_cache.clone(), v_cache.clone()
        view = qkv.view(n, heads + 2 * kv, d).transpose(0, 1)
        qk = apply_rope(view[: heads + kv], cos, sin)
        k_expected[:, slots], v_expected[:, slots] = qk[heads:], view[heads + kv :]
        q = rope_write(qkv, cos, sin, heads, kv, k_cache, v_cache, slots)
        tol = 2e-3 if dtype == torch.float16 else 1e-6
        for got, expected in ((q, qk[:heads]), (k_cache, k_expected), (v_cache, v_expected)):
            assert got.shape == expected.shape
            err = (got.float() - expected.float()).abs().max().item()
            assert err <= tol, (heads, kv, d, dtype, err)
    for rows, cols, dtype in [(3, 9000, torch.float32), (2, 4096, torch.float16), (1, 100, torch.float32)]:
        x = torch.randn(rows, cols, generator=g).to(dtype)
        x[0, 5] = x[0, -1] = 50  # a tie, across chunks where there are several: the first index wins
        assert argmax_rows(x).tolist() == x.argmax(-1).tolist() and argmax_rows(x)[0] == 5
    print("ok")
    """
)


@pytest.mark.parametrize("script", [SCRIPT, OPS_SCRIPT], ids=["paged-attention", "norm-swiglu-rope-argmax"])
def test_triton_kernel_matches_reference_in_the_interpreter(script):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
