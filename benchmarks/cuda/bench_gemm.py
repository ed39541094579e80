"""The projections of a batch-1 decode step of Qwen2.5-1.5B's shapes on a GPU: GPU time of one bf16 GEMM per
projection at M rows (1: a plain decode row; 32: what the batch-invariant row_chunked linear runs at batch 1),
with the weight as the model stores it ([out, in], F.linear) and transposed ([in, out], x @ w), as a share of
the card's memory bandwidth (the weight's bytes over the time). A diagnostic beside bench_cuda.py (issue 32):
how far the GEMMs alone are from the bandwidth limit, and what the 32-row padding costs.

    python benchmarks/cuda/bench_gemm.py --out DIR      (on the GPU machine)
Writes DIR/gemm_bench.json and DIR/gemm_bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import QWEN_1_5B, card  # noqa: E402
from bench_splitk import gpu_us_per_call  # noqa: E402

ROWS = (1, 8, 32)
STREAM_BYTES = 256 << 20  # the calls cycle through copies of a weight this large together: past the L2 cache


def shapes(c: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection of one layer, and the tied head."""
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * head_dim
    h, i = c["hidden_size"], c["intermediate_size"]
    return {
        "qkv_proj": (qkv, h),
        "o_proj": (h, h),
        "gate_up_proj": (2 * i, h),
        "down_proj": (h, i),
        "lm_head": (c["vocab_size"], h),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    device = torch.device("cuda")
    name, bandwidth = card(device)
    rows = []
    for proj, (n_out, n_in) in shapes(QWEN_1_5B).items():
        weight_bytes = n_out * n_in * 2
        copies = -(-STREAM_BYTES // weight_bytes)
        ws = [torch.randn(n_out, n_in, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        row = {"proj": proj, "out": n_out, "in": n_in, "weight_mb": round(weight_bytes / 1e6, 2), "copies": copies}
        for m in ROWS:
            x = torch.randn(m, n_in, device=device, dtype=torch.bfloat16)
            turn = iter(range(1 << 30))

            def linear(x=x, ws=ws, turn=turn):
                return F.linear(x, ws[next(turn) % len(ws)])

            def matmul(x=x, wts=wts, turn=turn):
                return x @ wts[next(turn) % len(wts)]

            for layout, fn in (("w", linear), ("wt", matmul)):
                us = gpu_us_per_call(fn, device)
                row[f"{layout}_m{m}_us"] = round(us, 2)
                if bandwidth:
                    row[f"{layout}_m{m}_bw"] = round(weight_bytes / (us * 1e-6) / bandwidth, 3)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del ws, wts
    per_step = {}
    for key in rows[0]:
        if key.endswith("_us"):
            layers = sum(r[key] for r in rows if r["proj"] != "lm_head") * QWEN_1_5B["num_hidden_layers"]
            per_step[key[:-3]] = round((layers + next(r[key] for r in rows if r["proj"] == "lm_head")) / 1e3, 3)
    report = {
        "card": name,
        "bandwidth_bytes_per_s": bandwidth,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", "benchmarks/cuda/bench_gemm.py"] + sys.argv[1:]),
        "projections": rows,
        "step_gemm_ms": per_step,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm_bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    keys = [k[:-3] for k in rows[0] if k.endswith("_us")]
    lines = [f"# bf16 GEMMs of Qwen2.5-1.5B's projections on {name} ({report['date']})", ""]
    lines += [f"Command: `{report['command']}`", ""]
    lines += ["GPU us per call (share of the bandwidth limit); w: F.linear on [out, in], wt: x @ [in, out];"]
    lines += ["m: rows. Each call reads another copy of the weight (copies past the L2 cache).", ""]
    lines += ["| projection | MB | " + " | ".join(keys) + " |", "|---" * (2 + len(keys)) + "|"]
    for r in rows:
        cells = " | ".join(f"{r[k + '_us']:.1f} ({r.get(k + '_bw', 0):.0%})" for k in keys)
        lines.append(f"| {r['proj']} | {r['weight_mb']} | {cells} |")
    step = ", ".join(f"{k} {v}" for k, v in per_step.items())
    lines += ["", f"A step's GEMMs (28 layers and the head), ms: {step}", ""]
    with open(os.path.join(args.out, "gemm_bench.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
