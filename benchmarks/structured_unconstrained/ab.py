"""Unconstrained requests before and after structured outputs (issue 34: "unconstrained requests unchanged
in speed"): `speclm serve` from two checkouts in turn (PYTHONPATH), the same greedy chat requests without
response_format or tools, tokens/s of decoding per run, and whether the texts are the same.

python benchmarks/structured_unconstrained/ab.py --before DIR --after DIR [--rounds 3] [--max-tokens 128]
    --out benchmarks/structured_unconstrained/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in three sentences.",
    "List five uses of a priority queue.",
    "Summarize the plot of Romeo and Juliet.",
]


def run(checkout: str, max_tokens: int, threads: int) -> dict:
    """One server from `checkout`: a warm-up request, then every prompt once, timed one at a time."""
    import httpx

    env = {**os.environ, "PYTHONPATH": checkout}
    cmd = [sys.executable, "-m", "speclm", "serve", "--threads", str(threads), "--port", "0"]  # (it names the port)
    server = subprocess.Popen(cmd, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            if "listening on" in line:
                break
        else:
            raise SystemExit(f"error: the server from {checkout} did not start")
        url = line.split("listening on", 1)[1].strip() + "/v1/chat/completions"
        texts, tokens, seconds = [], 0, 0.0
        for i, prompt in enumerate(["Hello."] + PROMPTS):
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
            start = time.perf_counter()
            reply = httpx.post(url, json=body, timeout=600).json()
            elapsed = time.perf_counter() - start
            if i:  # the first request warms the server up
                texts.append(reply["choices"][0]["message"]["content"])
                tokens += reply["usage"]["completion_tokens"]
                seconds += elapsed
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "texts": texts}
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="a checkout from before structured outputs")
    p.add_argument("--after", required=True, help="a checkout with them")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from speclm.bench.machine import machine_info
    from speclm.bench.report import header_lines

    def commit(checkout: str) -> str:
        git = ["git", "-C", checkout, "rev-parse", "--short", "HEAD"]
        return subprocess.run(git, capture_output=True, text=True).stdout.strip()

    runs = []
    for r in range(args.rounds):  # alternating, so that drifting load falls on both
        for label, checkout in (("before", args.before), ("after", args.after)):
            result = run(checkout, args.max_tokens, args.threads)
            runs.append({"round": r, "checkout": label, "commit": commit(checkout), **result})
            print(f"{label} round {r}: {result['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    rate = {
        label: sorted(x["tokens_per_s"] for x in runs if x["checkout"] == label)[args.rounds // 2]
        for label in ("before", "after")
    }
    same = all(x["texts"] == runs[0]["texts"] for x in runs)
    command = "python benchmarks/structured_unconstrained/ab.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    report = {"command": command, "machine": machine_info(), "runs": runs, "median": rate, "same_texts": same}
    lines = [
        *header_lines(
            "Unconstrained requests through `speclm serve`, before and after structured outputs",
            command,
            report["machine"],
            threads=args.threads,
        ),
        f"Default model, {len(PROMPTS)} chat prompts, greedy, {args.max_tokens} tokens at most, one request at a time "
        f"after a warm-up; the two checkouts alternate, {args.rounds} rounds.",
        "",
        "| round | checkout | commit | tokens | tokens/s |",
        "|---:|---|---|---:|---:|",
        *(
            f"| {x['round']} | {x['checkout']} | {x['commit']} | {x['tokens']} | {x['tokens_per_s']:.1f} |"
            for x in runs
        ),
        "",
        f"Median tokens/s: before {rate['before']:.1f}, after {rate['after']:.1f} "
        f"(after / before {rate['after'] / rate['before']:.2f}x); "
        f"the same texts in every run: {'yes' if same else 'no'}.",
        "",
    ]
    with open(f"{args.out}.json", "w") as f:
        json.dump(report, f, indent=1)
    with open(f"{args.out}.md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
