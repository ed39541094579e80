"""Speculation's batch limit on this machine: the server's throughput at concurrency C with plain decoding
and with the draft under several `spec_max_batch` limits (the engine drafts only in steps with at most that
many running sequences), the same requests in one run. The clients run in a process of their own.

python benchmarks/spec_max_batch/spec_max_batch.py --model TARGET --draft DRAFT [--limits 1,2,4]
    [--concurrency 2,4] [--prompts N] [--max-tokens T] [--out benchmarks/spec_max_batch]
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--limits", default="1,2,4")
    p.add_argument("--concurrency", default="2,4")
    p.add_argument("--prompts", type=int, default=1, help="prompts per category")
    p.add_argument("--categories", default="code,coding,math_reasoning,qa,rag,summarization")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()

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
    draft = llm.with_spec(f"draft:{args.draft}", 4, True)
    runs = [("plain", llm, None)] + [(f"draft, spec_max_batch {n}", draft, int(n)) for n in args.limits.split(",")]
    results = {}
    for name, served, limit in runs:
        app = build_app(served, CacheConfig(), ServerConfig(model_name="x"), spec_max_batch=limit)
        rows = serve_while(app, lambda url: run_levels(url, prompts, levels, args.max_tokens))
        results[name] = {r["concurrency"]: round(r["tokens_per_s"], 2) for r in rows}
        print(name, results[name], file=sys.stderr, flush=True)
    lines = [
        "# Speculation's batch limit through the server",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"Machine: {machine_info()['cpu']}, {len(prompts)} chat prompts ({args.categories}), greedy, "
        f"{args.max_tokens} tokens each, each level sends every prompt once.",
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
        with open(os.path.join(args.out, "spec_max_batch.json"), "w") as f:
            json.dump({"command": sys.argv, "machine": machine_info(), "results": results}, f, indent=2)
        with open(os.path.join(args.out, "spec_max_batch.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
