"""What attention costs in a pass of the real pair: attend_rows over every layer of the 1.5B target (12 query
heads, 2 kv heads, head_dim 128, 28 layers) and of the 0.5B draft (14, 2, 64, 24 layers), for N new rows after
C cached tokens, as decoding (1 row) and verification (K + 1 rows) run it.

`python benchmarks/avx2_kernel/attention_cost.py --label LABEL --out DIR` writes DIR/attention_cost_LABEL.{json,md}.
Random queries, keys and values (attention's cost does not depend on them); every layer reads keys and values
of its own, as a pass does, so they come from memory rather than from the cache of the layer before.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.kernels import cpu_kernels

SHAPES = {"target 1.5B": (12, 2, 128, 28), "draft 0.5B": (14, 2, 64, 24)}  # heads, kv heads, head_dim, layers
EMPTY = torch.empty(0, dtype=torch.long)


def pass_seconds(shape: tuple[int, int, int, int], context: int, rows: int, rounds: int) -> float:
    """Median seconds of attend_rows over every layer for `rows` new rows after `context` cached tokens."""
    heads, kv_heads, head_dim, layers = shape
    kernels = cpu_kernels()
    g = torch.Generator().manual_seed(0)
    slots = context + rows
    keys = [torch.randn(kv_heads, slots, head_dim, generator=g) for _ in range(layers)]
    values = [torch.randn(kv_heads, slots, head_dim, generator=g) for _ in range(layers)]
    q = torch.randn(heads, rows, head_dim, generator=g)
    lengths = torch.arange(context + 1, context + rows + 1)  # a causal chunk after the cached tokens
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        for k, v in zip(keys, values):
            kernels.attend_rows(q, k, v, lengths, EMPTY, EMPTY, head_dim**-0.5)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first warms up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/avx2_kernel/attention_cost.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--contexts", default="300,700,1000", help="cached tokens before the new rows")
    parser.add_argument("--rows", default="1,3,5", help="new rows: 1 (decoding) and K+1 (verification of K)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="run", help="names the output and its table row (e.g. the commit)")
    parser.add_argument("--out", default="benchmarks/avx2_kernel")
    args = parser.parse_args(argv)
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--contexts and --rows take integers, got {args.contexts!r}, {args.rows!r}")
    if min(contexts) < 0 or min(rows) < 1 or args.rounds < 1:
        parser.error("contexts >= 0, rows >= 1, rounds >= 1")
    if cpu_kernels() is None:
        print("error: the CPU kernels are not available here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    records = [
        {"model": name, "context": c, "rows": r, "median_s": pass_seconds(shape, c, r, args.rounds)}
        for name, shape in SHAPES.items()
        for c in contexts
        for r in rows
    ]
    command = "python benchmarks/avx2_kernel/attention_cost.py " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    machine = machine_info()
    lines = [
        *header_lines(f"attention in a pass of the real pair ({args.label})", command, machine, f"; HEAD {commit}"),
        "Median ms of attend_rows over every layer of a pass, N new rows after C cached tokens.",
        "",
        "| model | cached tokens | " + " | ".join(f"{r} row{'s' if r > 1 else ''} ms" for r in rows) + " |",
        "|---|---:|" + "---:|" * len(rows),
    ]
    median = {(x["model"], x["context"], x["rows"]): x["median_s"] for x in records}
    for name in SHAPES:
        for c in contexts:
            lines.append(f"| {name} | {c} | " + " | ".join(f"{1e3 * median[name, c, r]:.2f}" for r in rows) + " |")
    payload = {"machine": machine, "command": command, "label": args.label, "commit": commit, "records": records}
    write_report(args.out, f"attention_cost_{args.label}", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
