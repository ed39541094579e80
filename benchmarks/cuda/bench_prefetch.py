"""Does an L2 prefetch of a weight make the GEMM that reads it next faster? gate_up_proj and down_proj of
Qwen2.5-1.5B (bf16, column-major as speclm stores them, 32 rows as a batch-1 step runs them): GPU us per GEMM
alone, per prefetch alone, and per prefetch-then-GEMM on one stream, for the first MB of the weight prefetched
in each mode of l2_prefetch.py beside this file. Each call reads another copy of the weight (copies past L2).
A diagnostic for issue 32 (l2_prefetch_h100.md).

    python benchmarks/cuda/bench_prefetch.py --out DIR      (on the GPU machine)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_splitk import gpu_us_per_call  # noqa: E402
from l2_prefetch import prefetch_l2  # noqa: E402

STREAM_BYTES = 512 << 20


def cycling(items: list):
    """A function returning the next of `items` at each call, round and round."""
    turn = iter(range(1 << 30))
    return lambda: items[next(turn) % len(items)]


def projection(proj: str, n_out: int, n_in: int, sink: torch.Tensor, device: torch.device) -> list[dict]:
    nbytes = n_out * n_in * 2
    ws = [torch.randn(n_in, n_out, device=device, dtype=torch.bfloat16).t() for _ in range(STREAM_BYTES // nbytes)]
    x = torch.randn(32, n_in, device=device, dtype=torch.bfloat16)
    w = cycling(ws)
    gemm = gpu_us_per_call(lambda: F.linear(x, w()), device)
    rows = [{"proj": proj, "mode": "-", "mb": 0, "gemm_us": round(gemm, 2)}]
    print(rows[-1], flush=True)
    for mode in ("bulk", "load", "load32"):
        for mb in (8, 24, 40):
            try:
                w = cycling(ws)
                alone = gpu_us_per_call(lambda: prefetch_l2(w(), mb << 20, sink, mode), device)
                w = cycling(ws)

                def both():
                    weight = w()
                    prefetch_l2(weight, mb << 20, sink, mode)
                    F.linear(x, weight)

                pair = gpu_us_per_call(both, device)
                row = {"proj": proj, "mode": mode, "mb": mb, "prefetch_us": round(alone, 2)}
                row |= {"both_us": round(pair, 2), "gemm_after_us": round(pair - alone, 2)}
            except Exception as e:
                row = {"proj": proj, "mode": mode, "mb": mb, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(row, flush=True)
    return rows


OVERLAP_PLANS = [None, ("bulk", 16), ("bulk", 24), ("bulk", 32), ("load", 24), ("load16", 24), ("load32", 24)]
OVERLAP_PLANS += [("load64", 24), ("load32", 16), ("load32", 32)]


def overlap(sink: torch.Tensor, device: torch.device) -> list[dict]:
    """A layer's attention block in small: the qkv GEMM then 8 tiny dependent kernels (the latency-bound part),
    then gate_up's GEMM; a side stream forked at the block's start prefetches gate_up's first MB meanwhile.
    GPU us per block (each call another copy of both weights), and the same without gate_up's GEMM."""
    qkv = [torch.randn(1536, 2048, device=device, dtype=torch.bfloat16).t() for _ in range(40)]
    gate_up = [torch.randn(1536, 17920, device=device, dtype=torch.bfloat16).t() for _ in range(10)]
    x, small = torch.randn(32, 1536, device=device, dtype=torch.bfloat16), torch.zeros(32, 1536, device=device)
    side = torch.cuda.Stream(device)
    rows = []
    for plan in OVERLAP_PLANS:
        for with_gemm in (True, False):
            wq, wg = cycling(qkv), cycling(gate_up)

            def block(plan=plan, with_gemm=with_gemm, wq=wq, wg=wg):
                q, g = wq(), wg()
                main = torch.cuda.current_stream()
                if plan is not None:
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        prefetch_l2(g, plan[1] << 20, sink, plan[0])
                F.linear(x, q)
                for _ in range(8):
                    small.add_(1.0)
                if with_gemm:
                    F.linear(x, g)
                if plan is not None:
                    main.wait_stream(side)

            try:
                us = round(gpu_us_per_call(block, device), 2)
            except Exception as e:
                us = f"{type(e).__name__}: {e}"[:300]
            rows.append({"plan": "none" if plan is None else f"{plan[0]} {plan[1]} MB", "gate_up": with_gemm, "us": us})
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    device = torch.device("cuda")
    sink = torch.zeros(1 << 16, dtype=torch.int32, device=device)
    rows = overlap(sink, device)
    for proj, (n_out, n_in) in {"gate_up_proj": (17920, 1536), "down_proj": (1536, 8960)}.items():
        rows += projection(proj, n_out, n_in, sink, device)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "prefetch_bench.json"), "w") as f:
        json.dump({"card": torch.cuda.get_device_name(device), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
