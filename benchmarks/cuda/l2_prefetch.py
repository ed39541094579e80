"""Prefetching a weight's bytes into the GPU's L2 cache: an experiment of issue 32, not in the package
(l2_prefetch_h100.md: 0.5-0.8% of a batch-1 step at best; bench_prefetch.py uses these kernels).

A batch-1 decode step spends a third of its time in latency-bound kernels (norms, rotary, attention, the small
qkv and o projections) while the memory bus idles; bytes that the next bandwidth-bound GEMM will read could be
brought into L2 meanwhile from a side stream. Nothing is written but a sink that no prefetch ever stores to, so
a prefetch never changes a result. Ways to issue it:

- "bulk": Hopper's bulk-copy engine (`cp.async.bulk.prefetch.L2`), one instruction per CHUNK bytes (sm_90+);
  "bulkL" the same at L2's evict-last priority;
- "line": one `prefetch.global.L2` per 128-byte line (sm_80+);
- "load": plain loads summed into a value stored only if it is NaN (any GPU Triton runs on), one program per
  LOAD_BLOCK elements; "loadN": the same from N programs that each walk a contiguous share (few SMs taken from
  the kernels beside it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BULK_CHUNK = 16384  # bytes per bulk prefetch (a multiple of 16)
BULK_LANES = 32  # bulk prefetches per program
LINE_LANES = 1024  # 128-byte lines per program
LOAD_BLOCK = 4096  # bf16 elements per load
STREAM_BLOCK = 16384  # bf16 elements per loop step of a "loadN" program


BULK_ASM = tl.constexpr(
    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
)
# (the same with L2's evict-last priority: the lines stay while lines of normal priority can go instead)
BULK_LAST_ASM = tl.constexpr(
    "{ .reg .pred p; .reg .b64 pol; setp.ne.s32 p, $2, 0; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
    "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol; mov.u32 $0, 0; }"
)


@triton.jit
def _bulk_prefetch_kernel(base, nbytes, sink_ptr, CHUNK: tl.constexpr, LANES: tl.constexpr, LAST: tl.constexpr):
    i = tl.program_id(0) * LANES + tl.arange(0, LANES)
    start = i.to(tl.int64) * CHUNK
    size = tl.maximum(tl.minimum(nbytes - start, CHUNK), 0).to(tl.int32)
    done = tl.inline_asm_elementwise(
        asm=BULK_LAST_ASM if LAST else BULK_ASM,
        constraints="=r,l,r",
        args=[base + start, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
    tl.store(sink_ptr + i, done, mask=done != 0)  # (never: keeps the asm alive)


@triton.jit
def _line_prefetch_kernel(base, nbytes, sink_ptr, LANES: tl.constexpr):
    i = tl.program_id(0) * LANES + tl.arange(0, LANES)
    offset = i.to(tl.int64) * 128
    inside = (offset < nbytes).to(tl.int32)
    done = tl.inline_asm_elementwise(
        asm="{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        constraints="=r,l,r",
        args=[base + offset, inside],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
    tl.store(sink_ptr + i, done, mask=done != 0)


@triton.jit
def _load_prefetch_kernel(x_ptr, n, sink_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    total = tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32), axis=0)
    tl.store(sink_ptr + pid, total, mask=total != total)  # (only a NaN is stored: never for weights)


@triton.jit
def _stream_prefetch_kernel(x_ptr, n, sink_ptr, SHARE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * SHARE
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in tl.range(0, SHARE, BLOCK, num_stages=4):
        offs = start + off + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(sink_ptr + pid, total, mask=total != total)


def prefetch_l2(weight: torch.Tensor, nbytes: int, sink: torch.Tensor, mode: str = "bulk") -> None:
    """Bring the first `nbytes` of `weight`'s storage (from its data pointer, in memory order) into L2,
    on the current stream. `sink`: an int32 CUDA tensor of at least 1 << 16 entries that nothing reads."""
    nbytes = min(nbytes, weight.numel() * weight.element_size()) // 16 * 16
    if nbytes <= 0:
        return
    if mode in ("bulk", "bulkL"):
        grid = (triton.cdiv(triton.cdiv(nbytes, BULK_CHUNK), BULK_LANES),)
        last = mode == "bulkL"
        _bulk_prefetch_kernel[grid](
            weight.data_ptr(), nbytes, sink, CHUNK=BULK_CHUNK, LANES=BULK_LANES, LAST=last, num_warps=1
        )
    elif mode == "line":
        grid = (triton.cdiv(triton.cdiv(nbytes, 128), LINE_LANES),)
        _line_prefetch_kernel[grid](weight.data_ptr(), nbytes, sink, LANES=LINE_LANES, num_warps=4)
    elif mode == "load":
        n = nbytes // weight.element_size()
        flat = weight.as_strided((weight.numel(),), (1,))  # (the storage in memory order)
        _load_prefetch_kernel[(triton.cdiv(n, LOAD_BLOCK),)](flat, n, sink.view(torch.float32), BLOCK=LOAD_BLOCK)
    elif mode.startswith("load") and mode[4:].isdigit():
        n, programs = nbytes // weight.element_size(), int(mode[4:])
        share = triton.cdiv(triton.cdiv(n, programs), STREAM_BLOCK) * STREAM_BLOCK
        flat = weight.as_strided((weight.numel(),), (1,))
        _stream_prefetch_kernel[(programs,)](
            flat, n, sink.view(torch.float32), SHARE=share, BLOCK=STREAM_BLOCK, num_warps=8
        )
    else:
        raise ValueError(f"unknown prefetch mode {mode!r}: bulk, line, load or loadN")
