"""W8A8: int8 weights and per-row int8 activations on fbgemm's int8 GEMM, batch-invariant. The lm_head
of int4 models runs this way (weight_formats.head_format).

Why: the int8 GEMM reads a large vocabulary's head at memory speed, several times faster than
torch's int8 weight-only kernel, which is compute-bound on the CPU (benchmarks/kernels/). Whole
models in w8a8 read twice the bytes of int4 ones, so only the head uses it.

How the activations are quantized, and why this keeps speculative greedy exact: fbgemm's dynamic
op picks one (scale, zero point) for the whole input from its min and max, so a row's result would
depend on the other rows in the call. Each row is instead divided by its own absmax, and a constant
row holding +1 and -1 is put in front: every call then quantizes on the same [-1, 1] grid, and the
integer GEMM is exact, so a row's output does not depend on the batch (a verification row equals
the decoding call for the same token bit for bit). The row's absmax is multiplied back afterwards.
fbgemm runs only where speclm's kernel does not (no AVX-512 VNNI), and there its int8 products go
through VPMADDUBSW, whose 16-bit pair sums saturate with 8-bit activations (far off the float product
on an AVX2 CPU, test_w8a8_linear.py): it is called with reduce_range, 7-bit activations, which cannot.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import torch

from speclm.kernels import cpu_kernels
from speclm.models.op_module import OpModule
from speclm.models.quantizers import quantize_int8


def w8a8_supported() -> bool:
    """Whether this torch build has fbgemm's x86 int8 kernels (not on ARM builds)."""
    return bool({"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines))


def _quantized_int8_weight(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per output channel (quantizers.quantize_int8) as a quantized tensor fbgemm can
    prepack."""
    q, scales = quantize_int8(weight)
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized-tensor creation is deprecated, the kernel is not
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(q, scales.double(), zero_points, 0)


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """q int8 [N, K] -> speclm's w8a8 kernel layout [N/16, K/4, 64] (byte 4l+j of a block holds q[l, k+j])."""
    n, k = q.shape
    return q.view(n // 16, 16, k // 4, 4).transpose(1, 2).reshape(n // 16, k // 4, 64).contiguous()


def w8a8_kernels(weight: torch.Tensor) -> ModuleType | None:
    """speclm's compiled kernels when their w8a8 matmul fits this weight (CPU with AVX-512 VNNI,
    [N, K] with K % 4 == 0), else None (fbgemm runs it)."""
    if weight.device.type != "cpu" or weight.shape[1] % 4:
        return None
    kernels = cpu_kernels()
    return kernels if kernels is not None and kernels.w8a8_available() else None


class W8A8Linear(OpModule):
    """y = x @ W.T + b with W int8 per output channel and each row of x int8 (see the module doc);
    fp32 out. Runs speclm's VNNI kernel where it was compiled (each row quantized to int8 on its
    own absmax), else fbgemm (the pinned-row scheme)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight.device.type != "cpu":
            raise ValueError("a w8a8 layer runs on the CPU (fbgemm's int8 kernels)")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.on_kernel = w8a8_kernels(w) is not None  # speclm's kernel (a flag: modules stay copyable)
        if self.on_kernel:
            q, scales = quantize_int8(w)
            pad = -self.out_features % 16  # whole blocks of 16 outputs; the padding's outputs are dropped
            sums = q.sum(dim=1, dtype=torch.int32)
            if pad:
                q, scales, sums = (
                    torch.nn.functional.pad(t, (0, 0, 0, pad) if t.dim() == 2 else (0, pad)) for t in (q, scales, sums)
                )
            self.packed = pack_int8(q)
            self.weight_scales = scales.float().contiguous()
            self.weight_sums = sums
            return
        self.packed = torch.ops.quantized.linear_prepack(_quantized_int8_weight(w), None)
        # (int8 weight [N, K], scales [N]) for rows(), unpacked from fbgemm's layout on its first call and
        # kept: unpacking costs as much for a few rows as for all, and a draft head cuts rows per new token.
        self._unpacked: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows = torch.zeros(1, self.in_features)  # row 0: the +1/-1 pin, then the scaled input rows
        self._rows[0, 0], self._rows[0, 1 % self.in_features] = 1.0, -1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out] fp32
        x, n = x.float(), x.shape[0]  # bf16 inputs (an int4 model's head) are upcast; fp32 is a no-op
        if self.on_kernel:
            y = cpu_kernels().w8a8_matmul(x, self.packed, self.weight_scales, self.weight_sums)
            if y.shape[1] != self.out_features:
                y = y[:, : self.out_features]
            return y if self.bias is None else y + self.bias
        if self._rows.shape[0] < n + 1:
            with torch.inference_mode(False):  # a normal tensor, writable in and out of inference mode
                rows = torch.zeros(max(n + 1, 2 * self._rows.shape[0]), self.in_features)
                rows[0] = self._rows[0]
            self._rows = rows
        absmax = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_(min=1e-30)  # [n, 1]
        torch.div(x, absmax, out=self._rows[1 : n + 1])
        y = torch.ops.quantized.linear_dynamic(self._rows[: n + 1], self.packed, True)[1:] * absmax  # [n, out]
        return y if self.bias is None else y + self.bias

    def op(self):
        """forward without nn.Module dispatch (the draft heads' and int4 heads' per-token call)."""
        return self.forward

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 [out, in] weight this layer multiplies by (activation rounding aside)."""
        return self.dequantized_rows(torch.arange(self.out_features))

    def dequantized_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of dequantized_weight(), [len(index), in] fp32, without unpacking the others."""
        index = torch.as_tensor(index, dtype=torch.long)
        if self.on_kernel:  # row r is lane r % 16 of block r // 16 ([blocks, K/4, 16 lanes, 4 bytes])
            blocks, quads, _ = self.packed.shape
            q = self.packed.view(blocks, quads, 16, 4)[index // 16, :, index % 16, :]  # [n, K/4, 4]
            return q.reshape(index.numel(), quads * 4).float() * self.weight_scales[index, None]
        if self._unpacked is None:
            weight = torch.ops.quantized.linear_unpack(self.packed)[0]
            self._unpacked = (weight.int_repr(), weight.q_per_channel_scales().float())
        q, scales = self._unpacked
        return q[index].float() * scales[index, None]

    def rows(self, index: torch.Tensor) -> W8A8Linear:
        """A layer computing only output rows `index` (a draft head over a token subset, or the few
        context tokens a draft head adds as they appear). It dequantizes only those rows (on fbgemm, after
        one unpacking kept for the next cuts): dequantizing the whole of a large vocabulary's head at every
        new context token priced drafting out (benchmarks/draft_source/)."""
        bias = None if self.bias is None else self.bias[index]
        return W8A8Linear(self.dequantized_rows(index), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
