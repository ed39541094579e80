"""`speclm bench serve`'s HTTP clients, run as a program of their own (serve_bench.run_levels): a JSON job on
stdin's first line ({"servers" as [label, url] pairs, "prompts" as token ids, "levels" as [concurrency,
requests] pairs, "max_tokens", "sync"}), per level one result per server on stdout's last line. Requests go
in rounds of `concurrency` at once, and each round visits every server in turn (the order rotating from
round to round): the servers are compared request by request at the same moment, so the machine's drift
between minutes does not land on one server's rows. With "sync", before each measured round it writes
{"level": i, "ids": [...]} on a line of its own and waits for a line on stdin: the caller times its own
runs of those requests (the in-process engine) in between. It imports nothing from speclm (running it
loads no torch)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    values = sorted(values)
    pos = q * (len(values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


async def _one_request(client, url: str, prompt_ids: list[int], max_tokens: int) -> dict:
    body = {
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    times, text, tokens = [], [], max_tokens
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"benchmark request failed: {response.status_code} {await response.aread()!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            piece = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            if piece:  # a chunk with text: tokens arrived (a last chunk may carry only usage or finish_reason)
                times.append(time.perf_counter())
                text.append(piece)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not times:
        raise RuntimeError("benchmark request streamed no text")
    return {
        "ttft": times[0] - t0,
        "itl": [b - a for a, b in zip(times, times[1:])],
        "end": times[-1],
        "seconds": times[-1] - t0,
        "text": "".join(text),
        "tokens": tokens,
    }


async def run_level(
    servers: list[tuple[str, str]],
    prompts: list[list[int]],
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    sync_level: int | None = None,
) -> dict[str, dict]:
    """Send num_requests requests to each server, `concurrency` at once (round r: requests r*C .. r*C+C-1,
    the servers one after another); {label: throughput and latency percentiles}. `sync_level`: this level's
    index for the caller's turn before each round (see the module's docstring), None for no turns."""
    import httpx

    results: dict[str, dict[int, dict]] = {label: {} for label, _ in servers}
    walls = dict.fromkeys(results, 0.0)
    # A fresh connection per request: llama-server (cpp-httplib) closes a kept-alive connection after a
    # few requests, and a client that reuses it then sees "Server disconnected without sending a response".
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for r, first in enumerate(range(0, num_requests, concurrency)):
            ids = range(first, min(num_requests, first + concurrency))
            if sync_level is not None:  # the caller's turn (blocking: nothing else runs between rounds)
                print(json.dumps({"level": sync_level, "ids": list(ids)}), flush=True)
                sys.stdin.readline()
            turn = r % len(servers)
            for label, url in servers[turn:] + servers[:turn]:
                t0 = time.perf_counter()
                done = await asyncio.gather(
                    *(_one_request(client, url, prompts[i % len(prompts)], max_tokens) for i in ids)
                )
                walls[label] += time.perf_counter() - t0
                results[label].update(zip(ids, done))
    prompt_tokens = sum(len(prompts[i % len(prompts)]) for i in range(num_requests))
    return {
        label: _summary([by_id[i] for i in range(num_requests)], walls[label], concurrency, prompt_tokens)
        for label, by_id in results.items()
    }


def _summary(results: list[dict], wall: float, concurrency: int, prompt_tokens: int) -> dict:
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency,
        "requests": len(results),
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
        "request_tokens": [r["tokens"] for r in results],  # by request: per-category rates (serve_categories.py)
        "request_seconds": [r["seconds"] for r in results],
        "texts": [r["text"] for r in results],  # by request; callers drop it before writing results
    }


def main() -> None:
    job = json.loads(sys.stdin.readline())
    servers, prompts, max_tokens = [tuple(s) for s in job["servers"]], job["prompts"], job["max_tokens"]
    asyncio.run(run_level(servers, prompts, 1, 1, 4))  # warm-up
    rows = [
        asyncio.run(run_level(servers, prompts, c, n, max_tokens, i if job.get("sync") else None))
        for i, (c, n) in enumerate(job["levels"])
    ]
    print(json.dumps(rows), flush=True)


if __name__ == "__main__":
    main()
