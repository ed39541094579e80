"""How far ahead gguf_matmul should prefetch its weights: passes of 1 row (decoding) and of K+1 rows
(verification) per prefetch distance, on a GGUF model.

`python -m speclm.bench.prefetch --model PATH --threads 2` writes benchmarks/prefetch.{json,md}. The
distances are timed round-robin, so load from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

from speclm.bench.machine import machine_info
from speclm.bench.report import write_json
from speclm.kernels import cpu_kernels
from speclm.models.attention import BatchEntry


def measure(runner, distances: list[int], rows: list[int], context: int, rounds: int) -> list[dict]:
    """Median and best seconds of a pass over `r` new rows after `context` cached tokens, per distance."""
    kernels = cpu_kernels()
    block_size = 16
    cache = runner.new_paged_cache(-(-(context + max(rows) + 2) // block_size), block_size)
    prompt = [(7 * i + 3) % runner.config.vocab_size for i in range(context + max(rows))]
    runner.forward_batch(cache, [BatchEntry(prompt[:context], 0, list(range(context)), 0)])

    def run(r: int) -> None:  # the engine's verification pass: r rows, logits for all of them
        runner.forward_batch(cache, [BatchEntry(prompt[context : context + r], context, list(range(context + r)), r)])

    times: dict[tuple[int, int], list[float]] = {(d, r): [] for d in distances for r in rows}
    previous = kernels.gguf_set_prefetch(distances[0])
    try:
        for round_ in range(rounds + 1):
            for d in distances:
                kernels.gguf_set_prefetch(d)
                for r in rows:
                    t0 = time.perf_counter()
                    run(r)
                    if round_:  # round 0 warms up
                        times[d, r].append(time.perf_counter() - t0)
    finally:
        kernels.gguf_set_prefetch(previous)
    return [
        {
            "prefetch_bytes": d,
            "rows": r,
            "median_s": statistics.median(times[d, r]),
            "best_s": min(times[d, r]),
        }
        for d in distances
        for r in rows
    ]


def markdown(records: list[dict], title: str, command: str, machine: dict) -> str:
    distances = sorted({r["prefetch_bytes"] for r in records})
    rows = sorted({r["rows"] for r in records})
    median = {(r["prefetch_bytes"], r["rows"]): r["median_s"] for r in records}
    base = distances[0]
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, torch {machine.get('torch')} "
        f"({machine.get('torch_threads')} threads); 1-minute load average at the end "
        f"{machine.get('load_average_1min')}",
        "",
        "Median ms of a target pass over N new rows (logits for every row, as verification computes them), per "
        f"distance gguf_matmul prefetches ahead of the weights it reads. `vs {base}`: the ratio to the first "
        "distance's time; `/ 1 row`: the pass over N rows against the 1-row pass at the same distance.",
        "",
        "| prefetch bytes | "
        + " | ".join(f"{n} row{'s' if n > 1 else ''} ms" for n in rows)
        + " | "
        + " | ".join(f"{n} row{'s' if n > 1 else ''} vs {base}" for n in rows)
        + " | "
        + " | ".join(f"{n} rows / 1 row" for n in rows if n > 1)
        + " |",
        "|" + "---:|" * (1 + 2 * len(rows) + len([n for n in rows if n > 1])),
    ]
    for d in distances:
        cells = [f"{1e3 * median[d, n]:.1f}" for n in rows]
        cells += [f"{median[d, n] / median[base, n]:.2f}x" for n in rows]
        cells += [f"{median[d, n] / median[d, 1]:.2f}x" for n in rows if n > 1 and 1 in rows]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speclm.bench.prefetch", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a GGUF file")
    parser.add_argument("--weights", default="auto", help="runtime format (auto: the file's types; q4_0: drafts)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--distances", default="0,1024,2048,3072,4096", help="bytes, multiples of 64")
    parser.add_argument("--rows", default="1,5,6", help="rows per pass: 1 (decoding) and K+1 (verification of K)")
    parser.add_argument("--context", type=int, default=256, help="tokens already cached")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks")
    parser.add_argument("--name", default="prefetch")
    args = parser.parse_args(argv)
    try:
        distances = [int(d) for d in args.distances.split(",")]
        rows = sorted({int(r) for r in args.rows.split(",")} | {1})
    except ValueError:
        parser.error(f"--distances and --rows take comma-separated integers, got {args.distances!r}, {args.rows!r}")
    if any(d < 0 or d % 64 for d in distances) or min(rows) < 1 or args.rounds < 1:
        parser.error("distances must be multiples of 64 >= 0, rows >= 1, rounds >= 1")
    kernels = cpu_kernels()
    if kernels is None or not kernels.gguf_available():
        parser.error("the GGUF kernels are not available on this machine (AVX-512 VNNI)")

    from speclm.llm import LLM

    llm = LLM(args.model, threads=args.threads, weights=args.weights)
    records = measure(llm.runner, distances, rows, args.context, args.rounds)
    machine = machine_info() | {"load_average_1min": round(os.getloadavg()[0], 2)}
    command = "python -m speclm.bench.prefetch " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    title = f"gguf_matmul prefetch distance: {os.path.basename(args.model)}, --weights {args.weights}"
    title += f", context {args.context}"
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name)
    write_json(stem + ".json", {"command": command, "machine": machine, "records": records})
    table = markdown(records, title, command, machine)
    with open(stem + ".md", "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
