"""Sampled speculative decoding on a real model keeps the target's distribution: a G-test.

python benchmarks/sampling_exactness/sampling_exactness.py --model T --spec draft:D [--temperature 0.7 --top-k 20]
    [--samples 1500] --out benchmarks/sampling_exactness/NAME

The first two generated tokens of many seeded runs of three (speculative, K drafts per step: the second token is
verified against drafts, the first comes from the prompt's pass) are counted against
the target's exact two-token distribution, enumerated over the top-k support with plain forward passes.
The same counts are also tested against a wrong distribution (the target's at twice the temperature),
which the test must reject, or it would prove nothing. tests/speculative/test_exactness.py does the same
on the tiny test model with a broken verifier as the negative control; the G-test is tests/gtest.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from speclm.bench.machine import machine_info
from speclm.bench.report import output_paths, write_json
from speclm.llm import LLM
from speclm.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]

PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target (default: the default model)")
    ap.add_argument("--spec", required=True, help="a --spec value, e.g. draft:PATH")
    ap.add_argument("--k", type=int, default=4, help="drafts per step (fixed)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True, help="output path without extension")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))  # tests.gtest: the same G-test as the test suite's
    from tests.gtest import exact_sequences, g_test

    base = LLM(args.model, threads=args.threads)
    llm = base.with_spec(args.spec, num_speculative_tokens=args.k, adaptive=False)
    ids = base.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k)
    exact = exact_sequences(base, ids, params, 2)
    wrong = exact_sequences(base, ids, SamplingParams(temperature=args.temperature * 2, top_k=args.top_k), 2)
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    t0 = time.perf_counter()
    for seed in range(args.samples):
        # three tokens: the prompt's pass draws the first, the step after it verifies drafts for the second
        run = SamplingParams(temperature=args.temperature, top_k=args.top_k, seed=seed, max_tokens=3, ignore_eos=True)
        out = llm.generate(ids, run)[0]
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        drafted += out.stats.drafted_tokens
        accepted += out.stats.accepted_tokens
        if seed % 100 == 99:
            print(f"{seed + 1} samples, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    p_exact, p_wrong = g_test(counts, exact, args.samples), g_test(counts, wrong, args.samples)
    command = "python benchmarks/sampling_exactness/sampling_exactness.py " + " ".join(sys.argv[1:])
    machine = machine_info()
    report = {
        "command": command,
        "machine": machine,
        "samples": args.samples,
        "drafted": drafted,
        "accepted": accepted,
        "p_value": p_exact,
        "p_value_wrong_distribution": p_wrong,
        "counts": {f"{a},{b}": c for (a, b), c in counts.items()},
    }
    out_dir, _, name = args.out.rpartition("/")
    paths = output_paths(out_dir or ".", name)
    write_json(paths["json"], report)
    lines = [
        "# Sampled speculative decoding keeps the target's distribution (G-test)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores. The first two tokens of {args.samples} "
        f"seeded runs at temperature {args.temperature}, top-k {args.top_k}, K={args.k} drafts per step, "
        "against the target's exact two-token distribution (enumerated over the top-k support).",
        "",
        "| test | p-value | verdict at 0.001 |",
        "|---|---:|---|",
        f"| speculative samples vs the target's distribution | {p_exact:.3g} | "
        f"{'consistent' if p_exact > 1e-3 else 'REJECTED'} |",
        f"| the same samples vs a wrong distribution (temperature x2; negative control) | {p_wrong:.3g} | "
        f"{'rejected, as it must be' if p_wrong < 1e-3 else 'NOT rejected: too few samples to tell'} |",
        "",
        f"Drafts in these runs: {drafted}, accepted {accepted} ({100 * accepted / max(drafted, 1):.0f}%).",
    ]
    with open(paths["md"], "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
