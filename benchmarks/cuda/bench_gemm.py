"""The projections of a batch-1 decode step of Qwen2.5-1.5B's shapes on a GPU: GPU time of one bf16 GEMM per
projection, cuBLAS (F.linear at 1 row, and at the 32 rows the batch-invariant row_chunked linear runs at batch 1)
against a Triton GEMM written for decoding (triton_gemm.py beside this file: its shape's plan, and a sweep of
other blocks, splits, stages and warps; tried as speclm's path, no faster: not in the package), as a share of
the card's memory bandwidth (the weight's bytes over the time). Each plan's result is checked against an fp32
product, and each plan with the default's split against the default's bits (whether the rounding depends on
more than the split). A diagnostic beside bench_cuda.py (issue 32).

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


def sweep(n: int, k: int) -> list:
    """Plans to try beside the default: other column blocks, splits, stages and warps."""
    from triton_gemm import plan

    base = plan(n, k)
    plans = [base._replace(block_n=b) for b in (32, 64, 128) if b != base.block_n]
    units = k // base.block_k
    for split in sorted({1, 2, 3, 4, 5, 6, 7, 8, 10, 12} - {base.split}):
        if units % split == 0 and k // split >= 256 and len([p for p in plans if p.split != base.split]) < 3:
            plans.append(base._replace(split=split, k_split=k // split))
    plans += [base._replace(stages=s, warps=w) for s, w in ((3, 4), (6, 4), (4, 8), (5, 2))]
    return [base] + plans


def main() -> int:
    import triton_gemm

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    device = torch.device("cuda")
    name, bandwidth = card(device)
    rows = []

    def share(weight_bytes, us):
        return round(weight_bytes / (us * 1e-6) / bandwidth, 3) if bandwidth else None

    for proj, (n_out, n_in) in shapes(QWEN_1_5B).items():
        weight_bytes = n_out * n_in * 2
        copies = -(-STREAM_BYTES // weight_bytes)
        ws = [torch.randn(n_out, n_in, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        row = {"proj": proj, "out": n_out, "in": n_in, "weight_mb": round(weight_bytes / 1e6, 2), "copies": copies}
        for m in (1, 32):
            x = torch.randn(m, n_in, device=device, dtype=torch.bfloat16)
            turn = iter(range(1 << 30))
            us = gpu_us_per_call(lambda x=x, ws=ws, turn=turn: F.linear(x, ws[next(turn) % len(ws)]), device)
            row[f"cublas_m{m}_us"], row[f"cublas_m{m}_bw"] = round(us, 2), share(weight_bytes, us)
        x = torch.randn(32, n_in, device=device, dtype=torch.bfloat16)
        reference = x.float() @ ws[0].float().T
        scale = reference.abs().max().item()
        plans, default_bits = [], None
        for how in sweep(n_out, n_in):
            entry = {"plan": how._asdict()}
            try:
                got = triton_gemm.linear(x, ws[0], None, how)
                entry["max_err_rel"] = round((got.float() - reference).abs().max().item() / scale, 5)
                if default_bits is None:
                    default_bits = got
                elif how.split == plans[0]["plan"]["split"]:
                    entry["same_bits_as_default"] = bool(torch.equal(got, default_bits))
                turn = iter(range(1 << 30))
                us = gpu_us_per_call(
                    lambda how=how, ws=ws, turn=turn: triton_gemm.linear(x, ws[next(turn) % len(ws)], None, how), device
                )
                entry["us"], entry["bw"] = round(us, 2), share(weight_bytes, us)
            except Exception as e:  # (a plan the card cannot run: shared memory, registers)
                entry["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            plans.append(entry)
        row["triton_plans"] = plans
        timed = [e for e in plans if "us" in e]
        row["triton_default_us"] = plans[0].get("us")
        row["triton_best"] = min(timed, key=lambda e: e["us"]) if timed else None
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del ws
    layers = QWEN_1_5B["num_hidden_layers"]

    def step_ms(value):
        inner = sum(value(r) for r in rows if r["proj"] != "lm_head") * layers
        return round((inner + next(value(r) for r in rows if r["proj"] == "lm_head")) / 1e3, 3)

    per_step = {
        "cublas_m1": step_ms(lambda r: r["cublas_m1_us"]),
        "cublas_m32": step_ms(lambda r: r["cublas_m32_us"]),
        "triton_default": step_ms(lambda r: r["triton_default_us"] or 0.0),
        "triton_best": step_ms(lambda r: r["triton_best"]["us"] if r["triton_best"] else 0.0),
    }
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
    lines = [f"# bf16 GEMMs of Qwen2.5-1.5B's projections on {name} ({report['date']})", ""]
    lines += [f"Command: `{report['command']}`", ""]
    lines += ["GPU us per call (share of the bandwidth limit). cuBLAS: F.linear at 1 and 32 rows; Triton: speclm's"]
    lines += ["GEMM at 32 rows, its default plan and the best of the sweep (block_n/split/stages/warps). Each call"]
    lines += ["reads another copy of the weight (copies past the L2 cache).", ""]
    lines += ["| projection | MB | cuBLAS m1 | cuBLAS m32 | Triton default | Triton best | best plan | max rel err |"]
    lines += ["|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        d, b = r["triton_plans"][0], r["triton_best"] or {}
        cell = lambda e: f"{e['us']:.1f} ({e['bw']:.0%})" if e and "us" in e else e.get("error", "-")[:40]  # noqa: E731
        plan_text = "/".join(str(b["plan"][k]) for k in ("block_n", "split", "stages", "warps")) if b else "-"
        lines.append(
            f"| {r['proj']} | {r['weight_mb']} | {r['cublas_m1_us']:.1f} ({r['cublas_m1_bw']:.0%}) | "
            f"{r['cublas_m32_us']:.1f} ({r['cublas_m32_bw']:.0%}) | {cell(d)} | {cell(b)} | {plan_text} | "
            f"{d.get('max_err_rel', '-')} |"
        )
    step = ", ".join(f"{k} {v}" for k, v in per_step.items())
    lines += ["", f"A step's GEMMs (28 layers and the head), ms: {step}", ""]
    bits = [(r["proj"], e["plan"]) for r in rows for e in r["triton_plans"] if e.get("same_bits_as_default") is False]
    lines += [f"Plans with the default's split but other bits: {len(bits)} {bits[:4]}", ""]
    with open(os.path.join(args.out, "gemm_bench.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
