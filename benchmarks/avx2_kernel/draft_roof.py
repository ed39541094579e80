"""How close the real pair's 0.5B draft runs to the memory roof: its decoder layers' 96 one-row matmuls back to
back (at its drafting format, q4_0) against `torch.sum` over as many bytes, with 2 threads and with 1, and a
whole one-row pass of its layers after C cached tokens, whose time beyond the matmuls is everything else
(norms, rotary, attention, the additions, the interpreter). Each round measures every item once, in turn.

`python benchmarks/avx2_kernel/draft_roof.py --out DIR` writes DIR/draft_roof.{json,md} (needs `make pair`).
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
from speclm.data.pair import pair_path
from speclm.models.attention import BatchEntry
from speclm.models.gguf_weights import GGUFLinear


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/avx2_kernel/draft_roof.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--contexts", default="30,300", help="cached tokens before the pass's row")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/avx2_kernel")
    args = parser.parse_args(argv)
    contexts = sorted({int(c) for c in args.contexts.split(",")})
    draft = pair_path("draft")
    if draft is None:
        print("error: the pair is not fetched (make pair)", file=sys.stderr)
        return 2
    from speclm.llm import LLM

    runner = LLM(draft, threads=2, weights="q4_0").runner
    layers = [m for n, m in runner.model.named_modules() if isinstance(m, GGUFLinear) and "layers." in n]
    nbytes = sum(s.packed.numel() for m in layers for s in m.segments)
    ops = [(m.op(), torch.randn(1, m.in_features)) for m in layers]
    same_bytes = torch.rand(nbytes // 4)  # fp32: as many bytes as the layers' weights

    def matmuls() -> None:
        for op, x in ops:
            op(x)

    vocab, longest = runner.config.vocab_size, max(contexts)
    prompt = [(7 * i + 3) % vocab for i in range(longest + 1)]
    passes = {}
    for c in contexts:  # one cache per context, filled once; each pass rewrites the same row
        cache = runner.new_paged_cache(-(-(c + 17) // 16), 16)
        runner.forward_batch(cache, [BatchEntry(prompt[:c], 0, list(range(c)), 0)])
        entry = BatchEntry(prompt[c : c + 1], c, list(range(c + 1)), 0)
        passes[c] = lambda cache=cache, entry=entry: runner.forward_batch(cache, [entry])
    items = {f"{t} threads": t for t in (2, 1)}
    times: dict[str, list[float]] = {}
    for round_ in range(args.rounds + 1):
        for label, threads in items.items():
            torch.set_num_threads(threads)
            for name, fn in (("matmuls", matmuls), ("sum", same_bytes.sum)):
                t = timed(fn)
                if round_:  # round 0 warms up
                    times.setdefault(f"{name}, {label}", []).append(t)
        torch.set_num_threads(2)
        for c, fn in passes.items():
            t = timed(fn)
            if round_:
                times.setdefault(f"pass, {c} cached", []).append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python benchmarks/avx2_kernel/draft_roof.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    rows = [
        f"| {t} | {1e3 * med[f'matmuls, {t} threads']:.2f} | {nbytes / med[f'matmuls, {t} threads'] / 1e9:.1f} "
        f"| {1e3 * med[f'sum, {t} threads']:.2f} | {nbytes / med[f'sum, {t} threads'] / 1e9:.1f} "
        f"| {med[f'sum, {t} threads'] / med[f'matmuls, {t} threads']:.2f} |"
        for t in (2, 1)
    ]
    beyond = {c: med[f"pass, {c} cached"] - med["matmuls, 2 threads"] for c in contexts}
    pass_rows = [f"| {c} | {1e3 * med[f'pass, {c} cached']:.2f} | {1e3 * beyond[c]:.2f} |" for c in contexts]
    lines = [
        *header_lines("the 0.5B draft's one-row matmuls against the memory roof", command, machine, f"; HEAD {commit}"),
        f"The draft's {len(layers)} decoder-layer matmuls at q4_0 ({nbytes / 1e6:.0f} MB of weights), one row each, "
        f"back to back; `torch.sum` over {nbytes / 1e6:.0f} MB of fp32. Medians of {args.rounds} rounds.",
        "",
        "| threads | matmuls ms | GB/s | sum ms | GB/s | matmuls' speed / sum's |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "A one-row pass of the draft's layers (2 threads, no logits) after C cached tokens, and its time beyond the "
        "2-thread matmuls above:",
        "",
        "| cached tokens | pass ms | beyond the matmuls ms |",
        "|---:|---:|---:|",
        *pass_rows,
    ]
    payload = {"machine": machine, "command": command, "commit": commit, "weight_bytes": nbytes, "median_s": med}
    write_report(args.out, "draft_roof", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
