"""`speclm bench serve`: end-to-end serving throughput and latency at several concurrency levels.

A real server (uvicorn on 127.0.0.1, a free port) runs in this process; C streaming HTTP clients each
send requests back to back until the level's requests are done. Every request generates exactly
max_tokens tokens (ignore_eos), so throughput is tokens / wall time.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from contextlib import contextmanager

from speclm.bench.report import header_lines


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


@contextmanager
def serve_in_thread(app):
    """Run `app` with uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL; always stop it."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)


async def _one_request(client, url: str, prompt_ids: list[int], max_tokens: int) -> dict:
    body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    times = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"benchmark request failed: {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return {"ttft": times[0] - t0, "itl": [b - a for a, b in zip(times, times[1:])], "end": times[-1]}


async def run_level(url: str, prompts: list[list[int]], concurrency: int, num_requests: int, max_tokens: int) -> dict:
    """Send num_requests requests with `concurrency` clients; return throughput and latency percentiles."""
    import httpx

    queue = list(range(num_requests))
    results = []
    prompt_tokens = sum(len(prompts[i % len(prompts)]) for i in queue)

    async def worker(client) -> None:
        while queue:
            i = queue.pop(0)
            results.append(await _one_request(client, url, prompts[i % len(prompts)], max_tokens))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    tokens = num_requests * max_tokens
    return {
        "concurrency": concurrency,
        "requests": num_requests,
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "prompt_tokens": prompt_tokens,
        "total_tokens_per_s": (tokens + prompt_tokens) / wall,
        "ttft_p50": percentile(ttft, 0.5),
        "ttft_p99": percentile(ttft, 0.99),
        "itl_p50": percentile(itl, 0.5),
        "itl_p99": percentile(itl, 0.99),
        "itl_mean": statistics.fmean(itl) if itl else 0.0,
    }


def markdown(results: dict, title: str, command: str, machine: dict, note: str) -> str:
    lines = [
        *header_lines(title, command, machine, f". {note}"),
        "ITL is the gap between streamed chunks (a speculative step can stream several tokens at once).",
        "",
        "tokens/s counts generated tokens; prompt+gen/s adds the prompt tokens prefilled.",
        "",
        "| mode | concurrency | requests | tokens/s | vs concurrency 1 | vs first mode | prompt+gen tokens/s | "
        "TTFT p50 (s) | TTFT p99 (s) | ITL p50 (ms) | ITL p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first = next(iter(results.values()), [])
    reference = {r["concurrency"]: r["tokens_per_s"] for r in first}
    for mode, levels in results.items():
        base = levels[0]["tokens_per_s"] if levels else 0.0
        for r in levels:
            vs_first = r["tokens_per_s"] / reference[r["concurrency"]] if r["concurrency"] in reference else 0.0
            lines.append(
                f"| {mode} | {r['concurrency']} | {r['requests']} | {r['tokens_per_s']:.1f} | "
                f"{r['tokens_per_s'] / base:.2f}x | {vs_first:.2f}x | {r['total_tokens_per_s']:.1f} | "
                f"{r['ttft_p50']:.3f} | "
                f"{r['ttft_p99']:.3f} | {1000 * r['itl_p50']:.1f} | {1000 * r['itl_p99']:.1f} |"
            )
    return "\n".join(lines) + "\n"
