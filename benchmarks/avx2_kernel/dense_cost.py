"""What speclm's dense_matmul (every fp32/bf16 linear layer on the CPU) costs against torch's F.linear, on
SmolLM2-135M's shapes, with weights read from memory (30 matrices of each shape, one per layer, in turn).

`python benchmarks/avx2_kernel/dense_cost.py --label LABEL --out DIR` writes DIR/dense_cost_LABEL.{json,md}.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.kernels import cpu_kernels

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # [out, in]: qkv, o, gate_up, down
LAYERS = 30


def seconds(op, weights: list[torch.Tensor], x: torch.Tensor, rounds: int) -> float:
    """Median seconds of `op` over every weight in turn, per weight."""
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        for w in weights:
            op(x, w)
        times.append((time.perf_counter() - t0) / len(weights))
    return statistics.median(times[1:])  # the first warms up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/avx2_kernel/dense_cost.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", default="1,5", help="rows of x: 1 (decoding) and K+1 (verification)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="run", help="names the output (e.g. before/after a change)")
    parser.add_argument("--out", default="benchmarks/avx2_kernel")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows takes integers, got {args.rows!r}")
    if min(rows) < 1 or args.rounds < 1:
        parser.error("rows >= 1, rounds >= 1")
    kernels = cpu_kernels()
    if kernels is None:
        print("error: the CPU kernels are not available here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    empty = torch.empty(0)
    ops = {"dense_matmul": lambda x, w: kernels.dense_matmul(x, w, empty), "F.linear": lambda x, w: F.linear(x, w)}
    g = torch.Generator().manual_seed(0)
    records = []
    for out_features, in_features in SHAPES:
        weights = [torch.randn(out_features, in_features, generator=g) for _ in range(LAYERS)]
        for r in rows:
            x = torch.randn(r, in_features, generator=g)
            for name, op in ops.items():
                s = seconds(op, weights, x, args.rounds)
                gbs = out_features * in_features * 4 / s / 1e9
                records.append({"shape": [out_features, in_features], "rows": r, "op": name, "seconds": s, "gb_s": gbs})
    command = "python benchmarks/avx2_kernel/dense_cost.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    lines = [
        *header_lines(f"fp32 dense_matmul against F.linear ({args.label})", command, machine),
        f"Median ms per [out, in] fp32 weight ({LAYERS} of each shape in turn, so read from memory) and the weight's "
        "GB/s.",
        "",
        "| weight | rows | dense_matmul ms | F.linear ms | dense_matmul GB/s | F.linear GB/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by = {(tuple(x["shape"]), x["rows"], x["op"]): x for x in records}
    for shape in SHAPES:
        for r in rows:
            d, t = by[shape, r, "dense_matmul"], by[shape, r, "F.linear"]
            lines.append(
                f"| {shape[0]} x {shape[1]} | {r} | {1e3 * d['seconds']:.3f} | {1e3 * t['seconds']:.3f} | "
                f"{d['gb_s']:.1f} | {t['gb_s']:.1f} |"
            )
    payload = {"machine": machine, "command": command, "label": args.label, "records": records}
    write_report(args.out, f"dense_cost_{args.label}", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
