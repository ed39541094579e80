"""What a pass costs by how the GGUF-native layers run: passes of 1 row (decoding) and K+1 rows
(verification) per prefetch distance of gguf_matmul and with the native (C++) decoder or the Python
layers, on a GGUF model.

`python benchmarks/pass_cost/pass_cost.py --model PATH --threads 2` writes benchmarks/pass_cost/pass_cost.{json,md}. The
variants are timed round-robin, so load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.kernels import cpu_kernels
from speclm.models.attention import BatchEntry

LAYERS = ("python", "native")


def distances(prefetch: str) -> tuple[int, int]:
    """A variant's prefetch bytes: "D" (every pass) or "D1/DN" (passes over one row / over several)."""
    one, _, rows = prefetch.partition("/")
    return int(one), int(rows or one)


def measure(runner, variants: list[tuple[str, str]], rows: list[int], context: int, rounds: int) -> list[dict]:
    """Median and best seconds of a pass over `r` new rows after `context` cached tokens, per variant
    (prefetch bytes as `distances` reads them, "native" or "python" layers)."""
    kernels, model = cpu_kernels(), runner.model
    native = model.native_decoder
    block_size = 16
    cache = runner.new_paged_cache(-(-(context + max(rows) + 2) // block_size), block_size)
    prompt = [(7 * i + 3) % runner.config.vocab_size for i in range(context + max(rows))]
    runner.forward_batch(cache, [BatchEntry(prompt[:context], 0, list(range(context)), 0)])

    def run(r: int) -> None:  # the engine's verification pass: r rows, logits for all of them
        runner.forward_batch(cache, [BatchEntry(prompt[context : context + r], context, list(range(context + r)), r)])

    times: dict[tuple[str, str, int], list[float]] = {(d, lay, r): [] for d, lay in variants for r in rows}
    previous = kernels.gguf_set_prefetch(*distances(variants[0][0]))
    group = kernels.gguf_set_row_group(6)
    kernels.gguf_set_row_group(group)
    try:
        for round_ in range(rounds + 1):
            for d, layers in variants:
                kernels.gguf_set_prefetch(*distances(d))
                way, _, rows_a_pass = layers.partition("@")
                kernels.gguf_set_row_group(int(rows_a_pass) if rows_a_pass else group)
                model.native_decoder = native if way == "native" else None
                for r in rows:
                    t0 = time.perf_counter()
                    run(r)
                    if round_:  # round 0 warms up
                        times[d, layers, r].append(time.perf_counter() - t0)
    finally:
        kernels.gguf_set_prefetch(*previous)
        kernels.gguf_set_row_group(group)
        model.native_decoder = native
    return [
        {
            "prefetch_bytes": d,
            "layers": layers,
            "rows": r,
            "median_s": statistics.median(times[d, layers, r]),
            "best_s": min(times[d, layers, r]),
        }
        for d, layers in variants
        for r in rows
    ]


def markdown(records: list[dict], title: str, command: str, machine: dict) -> str:
    variants = list(dict.fromkeys((r["prefetch_bytes"], r["layers"]) for r in records))
    rows = sorted({r["rows"] for r in records})
    median = {(r["prefetch_bytes"], r["layers"], r["rows"]): r["median_s"] for r in records}
    base = variants[0]
    plural = {n: f"{n} row{'s' if n > 1 else ''}" for n in rows}
    lines = [
        *header_lines(
            title, command, machine, f"; 1-minute load average at the end {machine.get('load_average_1min')}"
        ),
        "Median ms of a pass over N new rows (logits for every row, as verification computes them), per "
        "distance gguf_matmul prefetches ahead of the weights it reads and per way the layers run (`native`: "
        f"one C++ call per pass; `python`: a layer at a time). `vs first`: the ratio to the first row's time "
        f"(prefetch {base[0]}, {base[1]} layers); `/ 1 row`: N rows against 1 row in the same variant.",
        "",
        "| prefetch bytes | layers | "
        + " | ".join(f"{plural[n]} ms" for n in rows)
        + " | "
        + " | ".join(f"{plural[n]} vs first" for n in rows)
        + " | "
        + " | ".join(f"{n} rows / 1 row" for n in rows if n > 1)
        + " |",
        "|---:|---|" + "---:|" * (2 * len(rows) + len([n for n in rows if n > 1])),
    ]
    for d, layers in variants:
        cells = [f"{1e3 * median[d, layers, n]:.1f}" for n in rows]
        cells += [f"{median[d, layers, n] / median[(*base, n)]:.2f}x" for n in rows]
        cells += [f"{median[d, layers, n] / median[d, layers, 1]:.2f}x" for n in rows if n > 1]
        lines.append(f"| {d} | {layers} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/pass_cost/pass_cost.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--weights", default="auto", help="runtime format (auto: the file's types; q4_0: drafts)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--variants",
        default="0:python,2048:python,0:native,1024:native,2048:native,3072:native,4096:native,2048/3072:native",
        help="comma-separated PREFETCH_BYTES:LAYERS (layers: native or python); the first is the baseline. "
        "PREFETCH_BYTES is one distance for every pass or ONE_ROW/SEVERAL_ROWS (the kernels' default: 2048/3072); "
        "LAYERS@N also sets the rows gguf_matmul multiplies in one pass over the weights (1-6; default: the kernels')",
    )
    parser.add_argument("--rows", default="1,5,6", help="rows per pass: 1 (decoding) and K+1 (verification of K)")
    parser.add_argument("--context", type=int, default=256, help="tokens already cached")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/pass_cost")
    parser.add_argument("--name", default="pass_cost")
    args = parser.parse_args(argv)
    try:
        variants = [(v.split(":")[0], v.split(":")[1]) for v in args.variants.split(",")]
        bytes_ = [b for d, _ in variants for b in distances(d)]
        rows = sorted({int(r) for r in args.rows.split(",")} | {1})
    except (ValueError, IndexError):
        parser.error(f"--variants takes BYTES:LAYERS items and --rows integers, got {args.variants!r}, {args.rows!r}")
    bad_layers = any(
        lay.partition("@")[0] not in LAYERS or lay.partition("@")[2] not in ("", *"123456") for _, lay in variants
    )
    if any(b < 0 or b % 64 for b in bytes_) or bad_layers or min(rows) < 1 or args.rounds < 1:
        parser.error("prefetch bytes must be multiples of 64 >= 0, layers native or python, rows >= 1, rounds >= 1")
    kernels = cpu_kernels()
    if kernels is None or not kernels.gguf_available():
        parser.error("the GGUF kernels are not available on this machine (AVX-512 VNNI or AVX2)")

    from speclm.llm import LLM

    llm = LLM(args.model, threads=args.threads, weights=args.weights)
    if llm.model.native_decoder is None and any(lay == "native" for _, lay in variants):
        parser.error(f"{args.model} at --weights {args.weights} has layers that are not GGUF-native: no native decoder")
    records = measure(llm.runner, variants, rows, args.context, args.rounds)
    machine = machine_info() | {"load_average_1min": round(os.getloadavg()[0], 2)}
    command = "python benchmarks/pass_cost/pass_cost.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    title = f"pass cost by prefetch distance and layers: {os.path.basename(args.model)}, --weights {args.weights}"
    title += f", context {args.context}"
    table = markdown(records, title, command, machine)
    write_report(args.out, args.name, {"command": command, "machine": machine, "records": records}, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
