"""Does a request's output depend on the load? N concurrent greedy streams against a running speclm
server, each compared with the same request sent alone to the same server, under several cache
settings (the defaults, a pool small enough to preempt, an int8 KV cache).

python benchmarks/invariance/invariance.py [--model M] [--weights W] [--streams 32] [--max-tokens 64]
    --out benchmarks/invariance/NAME
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httpx

SETTINGS = {
    "defaults": {},
    "preemption (64 blocks of 16)": {"num_blocks": 64},
    "int8 KV cache": {"kv_cache_dtype": "int8"},
    "int8 KV + preemption": {"kv_cache_dtype": "int8", "num_blocks": 64},
}


async def _stream(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


async def _concurrent(url: str, prompts: list[str], max_tokens: int) -> list[str]:
    async with httpx.AsyncClient(timeout=600) as client:
        return await asyncio.gather(*(_stream(client, url, p, max_tokens) for p in prompts))


async def _alone(url: str, prompts: list[str], max_tokens: int) -> list[str]:
    async with httpx.AsyncClient(timeout=600) as client:
        return [await _stream(client, url, p, max_tokens) for p in prompts]


def measure(llm, prompts: list[str], max_tokens: int, cache: dict) -> dict:
    """Concurrent vs alone on one server with CacheConfig(**cache); returns counts and timings."""
    from speclm.bench.serve_bench import serve_in_thread
    from speclm.config import CacheConfig
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig

    app = build_app(llm, CacheConfig(**cache), ServerConfig(model_name="invariance"))
    with serve_in_thread(app) as url:
        t0 = time.perf_counter()
        together = asyncio.run(_concurrent(url, prompts, max_tokens))
        t1 = time.perf_counter()
        alone = asyncio.run(_alone(url, prompts, max_tokens))
        t2 = time.perf_counter()
        engine = app.state.engine.engine
        return {
            "cache": cache,
            "streams": len(prompts),
            "differ": sum(a != b for a, b in zip(together, alone)),
            "preemptions": engine.scheduler.num_preemptions,
            "prefix_hit_tokens": engine.block_manager.stats.hit_tokens,
            "blocks_used_after": engine.block_manager.num_used_blocks,
            "concurrent_seconds": round(t1 - t0, 1),
            "alone_seconds": round(t2 - t1, 1),
        }


def main(argv: list[str] | None = None) -> int:
    from speclm.bench.machine import machine_info
    from speclm.data import SPECBENCH_PROMPTS, load_prompts
    from speclm.llm import LLM

    p = argparse.ArgumentParser(prog="python benchmarks/invariance/invariance.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--weights", default="fp32", help="runtime format (default fp32, speclm serve's default)")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    rows = load_prompts(SPECBENCH_PROMPTS, per_category=3)
    # Shared prefixes on purpose: a third of the prompts repeat another's opening (prefix-cache hits).
    prompts = [rows[i % len(rows)]["text"][:600] for i in range(args.streams)]
    prompts = [text if i % 3 else prompts[(i + 1) % len(prompts)][:300] + " " + text for i, text in enumerate(prompts)]
    llm = LLM(args.model, weights=args.weights, threads=args.threads)
    results = {name: measure(llm, prompts, args.max_tokens, cache) for name, cache in SETTINGS.items()}
    command = "python benchmarks/invariance/invariance.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = {
        "command": command,
        "machine": machine_info(),
        "weights": llm.weights.label,
        "max_tokens": args.max_tokens,
        "results": results,
    }
    lines = [
        f"# Batch invariance: {args.streams} concurrent greedy streams vs each sent alone",
        "",
        f"Command: `{command}`. Model {llm.model_path}, --weights {llm.weights.label}, {args.max_tokens} tokens "
        "each, Spec-Bench prompts (a third share an opening with another prompt).",
        "",
        "| cache setting | streams whose text differs from alone | preemptions | prefix-cache hit tokens "
        "| blocks used after |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['differ']} / {r['streams']} | {r['preemptions']} | {r['prefix_hit_tokens']} "
            f"| {r['blocks_used_after']} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with open(f"{args.out}.json", "w") as f:
            json.dump(report, f, indent=1)
        with open(f"{args.out}.md", "w") as f:
            f.write(table)
    return 0 if all(r["differ"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
