"""The paged-attention kernel's launch plans (keys per block, warps, pipeline stages) on Qwen2.5-1.5B's attention
shape (12 query heads, 2 KV heads, head_dim 128, bf16), in a batch-1 CUDA-graph step's layout: the real row among
31 padded rows of one key, over the short table (256 columns: the single pass) for short contexts and over the
whole table (split-K) for a long one. GPU us per call from a CUDA graph of calls (bench_splitk.py's method), the
largest difference to the torch reference, and whether a plan's output has the default plan's bits.

    python benchmarks/cuda/bench_attention_plans.py --out DIR      # on the GPU machine
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import card  # noqa: E402
from bench_splitk import gpu_us_per_call, kernel_case  # noqa: E402

CASES = ((40, 256), (160, 256), (250, 256), (2048, 32768))  # (context, table width)
BLOCKS, WARPS, STAGES = (32, 64, 128), (2, 4, 8), (1, 2, 3, 4)


def head_tail(device) -> dict:
    """GPU us per call of a 32-row pass's head tail (vocab 151936): the cast of bf16 logits to fp32, and each
    row's argmax over fp32 logits, over bf16 ones, and in two stages over bf16 (chunks of 128, then the
    chunks' maxima), with whether each gives the fp32 argmax's tokens."""
    logits = torch.randn(32, 151936, device=device).to(torch.bfloat16)
    wide = logits.float()
    want = wide.argmax(-1)

    def two_stage():
        values, inner = logits.view(32, -1, 128).max(-1)
        chunk = values.argmax(-1, keepdim=True)
        return (chunk * 128 + inner.gather(-1, chunk))[:, 0]

    out = {}
    for name, fn in (("cast", lambda: logits.float()), ("argmax_fp32", lambda: wide.argmax(-1)),
                     ("argmax_bf16", lambda: logits.argmax(-1)), ("two_stage_bf16", two_stage)):  # fmt: skip
        same = name == "cast" or bool(torch.equal(fn(), want))
        out[name] = {"us": round(gpu_us_per_call(fn, device), 2), "same_tokens": same}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/attention_plans")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from speclm.kernels import triton_attention
    from speclm.kernels.triton_attention import paged_attention
    from speclm.models.gpu_attention import attend_rows_reference

    device, default = torch.device("cuda"), dict(triton_attention.PLAN or triton_attention.NARROW_ROWS_PLAN)
    results = {"card": card(device)[0], "default": default, "cases": []}
    for context, width in CASES:
        q, keys, values, lengths, table, table_rows = kernel_case(
            context, "graph", 12, 2, 128, device, torch.bfloat16, False
        )
        table = table[:, :width].contiguous()
        reference = attend_rows_reference(
            q[:, :1], keys, values, lengths[:1], table[:1, :context], table_rows[:1], 128**-0.5
        )

        def call():
            return paged_attention(q, keys, values, lengths, table, table_rows, 128**-0.5)

        triton_attention.PLAN = None
        base = call()[:, :1].clone()
        rows = []
        for block, warps, stages in itertools.product(BLOCKS, WARPS, STAGES):
            triton_attention.PLAN = dict(BLOCK_N=block, num_warps=warps, num_stages=stages)
            try:
                out = call()[:, :1]
                rows.append({
                    "block": block, "warps": warps, "stages": stages, "us": round(gpu_us_per_call(call, device), 2),
                    "max_err": (out.float() - reference.float()).abs().max().item(),
                    "default_bits": bool(torch.equal(out, base)),
                })  # fmt: skip
            except Exception as e:  # (a plan that does not fit: say so, go on)
                rows.append({"block": block, "warps": warps, "stages": stages, "error": f"{type(e).__name__}"})
        triton_attention.PLAN = None
        rows.sort(key=lambda r: r.get("us", 1e9))
        results["cases"].append({"context": context, "width": width, "plans": rows})
        best = [
            f"{r['block']}/{r['warps']}/{r['stages']} {r.get('us', r.get('error'))}"
            + ("" if r.get("default_bits", True) else " (bits differ)")
            for r in rows[:8]
        ]
        print(f"context {context} width {width}: " + "; ".join(best), flush=True)
        default_row = next(r for r in rows if (r["block"], r["warps"], r["stages"]) == tuple(default.values()))
        print(f"  default {default_row.get('us')}", flush=True)
    results["head_tail"] = head_tail(device)
    print(json.dumps(results["head_tail"]), flush=True)
    with open(os.path.join(args.out, "attention_plans.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
