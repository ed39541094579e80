"""Speculation's batch limit on this machine: the server's throughput at concurrency C with plain decoding
and with a speculative method under several `spec_max_batch` limits (the engine drafts only in steps with at
most that many running sequences), the same requests in one run, every mode's server started with the
prompts in its prefix cache (one 2-token request each first), the modes in turn `--repeats` times. The
clients run in a process of their own.

python benchmarks/spec_max_batch/spec_max_batch.py --model TARGET (--draft DRAFT | --spec METHOD)
    [--limits default,1,2,4] [--concurrency 2,4] [--prompts N] [--max-tokens T] [--repeats R]
    [--out benchmarks/spec_max_batch] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft", default=None, help="a draft model: --spec draft:DRAFT")
    p.add_argument("--spec", default=None, help="the method (ngram, draft:PATH, ...); default draft:DRAFT")
    p.add_argument("--limits", default="1,2,4", help="comma-separated; 'default' is the engine's own")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--concurrency", default="2,4")
    p.add_argument("--prompts", type=int, default=1, help="prompts per category")
    p.add_argument("--categories", default="code,coding,math_reasoning,qa,rag,summarization")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=None)
    p.add_argument("--name", default="spec_max_batch", help="the files' name under --out")
    args = p.parse_args()
    if (args.spec is None) == (args.draft is None):
        p.error("give --draft DRAFT or --spec METHOD")
    method = args.spec or f"draft:{args.draft}"

    from speclm import LLM
    from speclm.bench.machine import machine_info
    from speclm.bench.serve_bench import run_levels
    from speclm.config import CacheConfig
    from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig
    from speclm.server.launch import serve_while

    cats = args.categories.split(",")
    texts = [q["text"] for q in load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", args.prompts, cats)]
    llm = LLM(args.model, threads=2)
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    levels = [(int(c), len(prompts)) for c in args.concurrency.split(",")]
    spec = llm.with_spec(method, 4, True)
    limits = [None if n == "default" else int(n) for n in args.limits.split(",")]
    runs = [("plain", llm, None)] + [
        (f"{method}, spec_max_batch {'default' if n is None else n}", spec, n) for n in limits
    ]
    reps: dict[str, list[dict[int, float]]] = {name: [] for name, _, _ in runs}

    def measure(url: str) -> list[dict]:
        run_levels(url, prompts, [(1, len(prompts))], 2)  # the prompts into this server's prefix cache
        return run_levels(url, prompts, levels, args.max_tokens)

    for _ in range(args.repeats):
        for name, served, limit in runs:
            app = build_app(served, CacheConfig(), ServerConfig(model_name="x"), spec_max_batch=limit)
            rows = serve_while(app, measure)
            reps[name].append({r["concurrency"]: round(r["tokens_per_s"], 2) for r in rows})
            print(name, reps[name][-1], file=sys.stderr, flush=True)
    results = {name: {c: statistics.median(r[c] for r in rows) for c, _ in levels} for name, rows in reps.items()}
    lines = [
        "# Speculation's batch limit through the server",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Machine: {machine_info()['cpu']}, {len(prompts)} chat prompts ({args.categories}), greedy, "
        f"{args.max_tokens} tokens each, each level sends every prompt once; medians of {args.repeats} "
        "rounds (each round runs every mode in turn), ratios of the medians.",
        "",
        "| mode | " + " | ".join(f"concurrency {c} tokens/s | vs plain" for c, _ in levels) + " |",
        "|---|" + "---:|---:|" * len(levels),
    ]
    for name, row in results.items():
        cells = [f"{row[c]:.1f} | {row[c] / results['plain'][c]:.2f}x" for c, _ in levels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
            json.dump({"command": sys.argv, "machine": machine_info(), "results": results, "rounds": reps}, f, indent=2)
        with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
