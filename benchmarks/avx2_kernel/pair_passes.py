"""Whole passes of the real pair as a speculative step runs them: the 1.5B target over N new rows with their
logits (decoding: 1 row, verification of K drafts: K + 1) and the 0.5B draft's decoder layers over N rows at its
drafting format (q4_0), after C cached tokens. For A/B runs of kernel builds: run it once per build, alternating.

`python benchmarks/avx2_kernel/pair_passes.py --label LABEL --out DIR` writes DIR/pair_passes_LABEL.{json,md}
(needs `make pair`). The draft's head is left out: the engine's draft reads a head cut to its token map, a
standalone load of the file reads the whole one.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.data.pair import pair_path
from speclm.models.attention import BatchEntry


def pass_medians(path: str, weights: str, logits: bool, context: int, rows: list[int], rounds: int) -> dict:
    """Median seconds of a pass over r new rows after `context` cached tokens, per r (the same rows each time)."""
    from speclm.llm import LLM

    runner = LLM(path, threads=2, weights=weights).runner
    prompt = [(7 * i + 3) % runner.config.vocab_size for i in range(context + max(rows))]
    cache = runner.new_paged_cache(-(-(context + max(rows) + 16) // 16), 16)
    runner.forward_batch(cache, [BatchEntry(prompt[:context], 0, list(range(context)), 0)])
    times: dict[int, list[float]] = {r: [] for r in rows}
    for round_ in range(rounds + 1):
        for r in rows:
            entry = BatchEntry(prompt[context : context + r], context, list(range(context + r)), r if logits else 0)
            t0 = time.perf_counter()
            runner.forward_batch(cache, [entry])
            if round_:  # round 0 warms up
                times[r].append(time.perf_counter() - t0)
    return {r: statistics.median(t) for r, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/avx2_kernel/pair_passes.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--context", type=int, default=300, help="cached tokens before the new rows")
    parser.add_argument("--rows", default="1,4", help="new rows: 1 (decoding) and K+1 (verification of K)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--label", default="run", help="names the output and its table row (e.g. the build)")
    parser.add_argument("--out", default="benchmarks/avx2_kernel")
    args = parser.parse_args(argv)
    try:
        rows = sorted({int(r) for r in args.rows.split(",")})
    except ValueError:
        parser.error(f"--rows takes integers, got {args.rows!r}")
    if args.context < 1 or rows[0] < 1 or args.rounds < 1:
        parser.error("context >= 1, rows >= 1, rounds >= 1")
    target, draft = pair_path("target"), pair_path("draft")
    if target is None or draft is None:
        print("error: the pair is not fetched (make pair)", file=sys.stderr)
        return 2
    models = {"target 1.5B (with logits)": (target, "auto", True), "draft 0.5B (q4_0, layers)": (draft, "q4_0", False)}
    medians = {name: pass_medians(p, w, lg, args.context, rows, args.rounds) for name, (p, w, lg) in models.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python benchmarks/avx2_kernel/pair_passes.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    lines = [
        *header_lines(f"passes of the real pair ({args.label})", command, machine, f"; HEAD {commit}"),
        f"Median ms of a pass over N new rows after {args.context} cached tokens, {args.rounds} rounds.",
        "",
        "| model | " + " | ".join(f"{r} row{'s' if r > 1 else ''} ms" for r in rows) + " |",
        "|---|" + "---:|" * len(rows),
        *(f"| {name} | " + " | ".join(f"{1e3 * m[r]:.1f}" for r in rows) + " |" for name, m in medians.items()),
    ]
    records = [{"model": name, "rows": r, "median_s": m[r]} for name, m in medians.items() for r in rows]
    payload = {"machine": machine, "command": command, "label": args.label, "commit": commit, "records": records}
    write_report(args.out, f"pair_passes_{args.label}", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
