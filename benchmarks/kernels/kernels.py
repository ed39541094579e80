"""Microbenchmark of speclm's CPU kernels against the torch ops they replace, on SmolLM2-135M's shapes (and
Qwen2.5-1.5B's attention)
(`python benchmarks/kernels/kernels.py --threads 2`; writes benchmarks/kernels/kernels.{json,md})."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_json
from speclm.kernels import cpu_kernels
from speclm.models.attention import DecodeRows, attend_like_decoding
from speclm.models.quantizers import quantize_int4

ROWS = (1, 5, 9)  # a decode row; verification of K = 4 and K = 8 drafts


def best_us(fn, repeats: int) -> float:
    """Best of 3 means over `repeats` calls, in microseconds (cache-warm: the same weights each call)."""
    for _ in range(10):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeats * 1e6)
    return best


def int4_rows(kernels, repeats: int) -> list[dict]:
    from speclm.models.quant_linear import Int4Linear

    out = []
    for n_out, k_in in [(3072, 576), (960, 576), (576, 576), (576, 1536)]:  # gate_up, qkv, o, down
        weight = torch.randn(n_out, k_in, generator=torch.Generator().manual_seed(0))
        layer = Int4Linear(weight)
        q, _, _ = quantize_int4(weight, 32)
        torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        scale, zero = layer.group_scales_and_zeros()
        torch_pairs = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().bfloat16()
        for m in ROWS:
            x = torch.randn(m, k_in).bfloat16()
            ours = best_us(lambda: kernels.int4_matmul(x, layer.weight, 32, layer.scales_and_zeros), repeats)
            theirs = best_us(
                lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, torch_packed, 32, torch_pairs), repeats
            )
            out.append({"op": f"int4 {n_out}x{k_in}", "rows": m, "speclm_us": ours, "torch_us": theirs})
    return out


def head_rows(kernels, repeats: int) -> list[dict]:
    from speclm.models import w8a8_linear

    weight = torch.randn(49152, 576, generator=torch.Generator().manual_seed(1))
    ours_layer = w8a8_linear.W8A8Linear(weight)
    kernel_lookup = w8a8_linear.w8a8_kernels
    w8a8_linear.w8a8_kernels = lambda w: None  # the fbgemm layer, for comparison
    try:
        fbgemm_layer = w8a8_linear.W8A8Linear(weight)
    finally:
        w8a8_linear.w8a8_kernels = kernel_lookup
    out = []
    head_repeats = max(1, repeats // 10)  # the head is far larger than a layer: fewer calls suffice
    for m in ROWS:
        x = torch.randn(m, 576)
        out.append(
            {
                "op": "w8a8 head 49152x576",
                "rows": m,
                "speclm_us": best_us(lambda: ours_layer(x), head_repeats),
                "torch_us": best_us(lambda: fbgemm_layer(x), head_repeats),
            }
        )
    return out


def attention_rows(kernels, repeats: int) -> list[dict]:
    out = []
    shapes = [(9, 3, 64, (128, 512, 2048)), (12, 2, 128, (512, 2048))]  # SmolLM2-135M; Qwen2.5-1.5B (the real pair)
    for heads, kv_heads, d, lengths in shapes:
        out += attention_shape(heads, kv_heads, d, lengths, repeats)
    return out


def attention_shape(heads: int, kv_heads: int, d: int, lengths: tuple[int, ...], repeats: int) -> list[dict]:
    out = []
    for length in lengths:
        keys, values = torch.randn(kv_heads, length, d), torch.randn(kv_heads, length, d)
        for m in ROWS:
            q = torch.randn(heads, m, d)
            rows = DecodeRows.causal(length, m)
            ours = best_us(lambda: attend_like_decoding(q, keys, values, rows), repeats)
            theirs = best_us(
                lambda: [
                    F.scaled_dot_product_attention(
                        q[None, :, i : i + 1],
                        keys[None, :, : length - m + i + 1],
                        values[None, :, : length - m + i + 1],
                        enable_gqa=True,
                    )
                    for i in range(m)
                ],
                repeats,
            )
            op = f"attention {heads} heads ({kv_heads} kv, dim {d}), {length} keys"
            out.append({"op": op, "rows": m, "speclm_us": ours, "torch_us": theirs})
    return out


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=positive_int, default=200)
    p.add_argument("--out", default="benchmarks/kernels")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = cpu_kernels()
    if kernels is None or not (kernels.int4_available() and kernels.w8a8_available()):
        raise SystemExit("speclm's CPU kernels (with AVX-512 BF16 and VNNI) are not available here")
    records = (
        int4_rows(kernels, args.repeats) + head_rows(kernels, args.repeats) + attention_rows(kernels, args.repeats)
    )
    command = f"python benchmarks/kernels/kernels.py --threads {args.threads} --repeats {args.repeats}"
    machine = machine_info()
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "kernels.json"), {"command": command, "machine": machine, "records": records})
    lines = [
        *header_lines(
            "speclm CPU kernels vs the torch ops they replace (SmolLM2-135M shapes, Qwen2.5-1.5B attention)",
            command,
            machine,
            ". Cache-warm microbenchmark (the same weights every call; in a model the int4 weights come from "
            "memory): best of 3 means, microseconds. torch side: `_weight_int4pack_mm_for_cpu`, fbgemm's dynamic "
            "linear (the w8a8 head's fallback), one SDPA call per row (the attention fallback).",
            threads=args.threads,
        ),
        "| op | rows | speclm us | torch us | torch / speclm |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['op']} | {r['rows']} | {r['speclm_us']:.1f} | {r['torch_us']:.1f} | "
            f"{r['torch_us'] / r['speclm_us']:.2f}x |"
        )
    with open(os.path.join(args.out, "kernels.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
