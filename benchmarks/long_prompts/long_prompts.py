"""Long prompts through the servers: the time to read a 1024-, 2048- and 4096-token prompt (one token
generated) by `speclm serve` against llama.cpp's `llama-server`, the real pair's target, both servers up at
once, each round's prompts new to both (no prefix cache hits), the servers' order alternating by round.

    python benchmarks/long_prompts/long_prompts.py --llama-bin DIR --out benchmarks/long_prompts
Writes long_prompts.json and .md. Needs `make pair` and llama.cpp's programs (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LENGTHS = (1024, 2048, 4096)


def prompt_texts(tokenizer, rounds: int) -> list[dict[int, str]]:
    """For each round, a text of each length in tokens: consecutive, non-overlapping spans of the repository's
    prompt files, so no prompt shares a prefix with an earlier one."""
    text = "".join(
        open(os.path.join(ROOT, "speclm/data", f)).read() for f in ("specbench_dev.jsonl", "coding_prompts.jsonl")
    )
    ids, start, texts = tokenizer.encode(text, add_bos=False), 0, []
    for _ in range(rounds):
        texts.append({})
        for n in LENGTHS:
            if start + n > len(ids):
                raise SystemExit(f"the prompt files hold {len(ids)} tokens, too few for {rounds} rounds")
            texts[-1][n] = tokenizer.decode(ids[start : start + n])
            start += n
    return texts


def read_time(url: str, text: str) -> tuple[float, int]:
    """Seconds for a one-token completion of `text`, and the prompt tokens the server counted."""
    import httpx

    body = {"model": "m", "prompt": text, "max_tokens": 1, "temperature": 0}
    t = time.perf_counter()
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    seconds = time.perf_counter() - t
    r.raise_for_status()
    return seconds, r.json()["usage"]["prompt_tokens"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-bin", required=True, help="the folder with llama.cpp's llama-server")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=HERE)
    args = p.parse_args()
    from speclm.bench.llama_server import LlamaServerPeer
    from speclm.bench.machine import machine_info
    from speclm.bench.speclm_server import SpeclmServer
    from speclm.data.pair import pair_path
    from speclm.tokenizer import load_tokenizer

    target = str(pair_path("target"))
    texts = prompt_texts(load_tokenizer(target), args.rounds)
    servers = {
        "speclm serve": SpeclmServer(
            "speclm serve", ["--model", target, "--threads", str(args.threads)], None, None, True
        ),
        "llama-server": LlamaServerPeer("llama-server", args.llama_bin, target, args.threads),
    }
    runs: dict[str, list[dict]] = {name: [] for name in servers}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(s.serving(1, 2 * max(LENGTHS))) for name, s in servers.items()}
        for url in urls.values():  # warm-up: kernels, first passes
            read_time(url, "Say hi.")
        for r, round_texts in enumerate(texts):
            for name in list(urls) if r % 2 == 0 else list(urls)[::-1]:
                for n, text in round_texts.items():
                    seconds, tokens = read_time(urls[name], text)
                    runs[name].append({"round": r, "length": n, "prompt_tokens": tokens, "seconds": seconds})
                    print(name, runs[name][-1], flush=True)
    summary = {
        name: {n: statistics.median(x["seconds"] for x in rs if x["length"] == n) for n in LENGTHS}
        for name, rs in runs.items()
    }
    machine = machine_info()
    command = "python benchmarks/long_prompts/long_prompts.py --llama-bin DIR --out benchmarks/long_prompts" + (
        f" --rounds {args.rounds}" if args.rounds != 2 else ""
    )
    with open(os.path.join(args.out, "long_prompts.json"), "w") as f:
        json.dump({"command": command, "machine": machine, "runs": runs, "summary": summary}, f, indent=1)
    ours, peer = summary["speclm serve"], summary["llama-server"]
    lines = [
        "# Reading a long prompt: `speclm serve` against `llama-server` (Qwen2.5-Coder-1.5B Q4_K_M)",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        f"{args.threads} threads for both servers.",
        f"Seconds from sending a completion request (one token to generate, greedy) to its answer, median of "
        f"{args.rounds} rounds; every prompt is new to both servers, both are up at once, their order alternates "
        "by round. Prompts: spans of the repository's prompt files (chat-free text).",
        "",
        "| prompt tokens | speclm serve s | llama-server s | speclm tokens/s | llama-server tokens/s | speedup |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in LENGTHS:
        speeds = f"{n / ours[n]:.0f} | {n / peer[n]:.0f} | {peer[n] / ours[n]:.2f}x"
        lines.append(f"| {n} | {ours[n]:.2f} | {peer[n]:.2f} | {speeds} |")
    with open(os.path.join(args.out, "long_prompts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
