"""`speclm bench serve`: end-to-end serving throughput and latency at several concurrency levels.

A real server runs in this process (speclm/server/launch.py: the engine on the thread that loaded the
model, as `speclm serve` runs it; uvicorn on 127.0.0.1, a free port), or a peer's server in its own
process; C streaming HTTP clients each send requests back to back until the level's requests are done.
Every request generates max_tokens tokens (ignore_eos; the server's usage counts them), so throughput
is tokens / wall time.
"""

from __future__ import annotations

import asyncio
import json
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
    """Run `app` with uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL; always stop it.
    Its engine runs on a thread of its own, not the one that loaded the model: for functional checks
    (fuzzing, invariance); timings go through speclm.server.launch.serve_while."""
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
        "text": "".join(text),
        "tokens": tokens,
    }


async def run_level(url: str, prompts: list[list[int]], concurrency: int, num_requests: int, max_tokens: int) -> dict:
    """Send num_requests requests with `concurrency` clients; return throughput and latency percentiles."""
    import httpx

    queue = list(range(num_requests))
    results: dict[int, dict] = {}
    prompt_tokens = sum(len(prompts[i % len(prompts)]) for i in queue)

    async def worker(client) -> None:
        while queue:
            i = queue.pop(0)
            results[i] = await _one_request(client, url, prompts[i % len(prompts)], max_tokens)

    # A fresh connection per request: llama-server (cpp-httplib) closes a kept-alive connection after a
    # few requests, and a client that reuses it then sees "Server disconnected without sending a response".
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    results = [results[i] for i in range(num_requests)]
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
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
        "texts": [r["text"] for r in results],  # by request; callers drop it before writing results
    }


def markdown(results: dict, title: str, command: str, machine: dict, note: str) -> str:
    lines = [
        *header_lines(title, command, machine, f". {note}"),
        "ITL is the gap between streamed chunks (a speculative step can stream several tokens at once).",
        "",
        "tokens/s counts generated tokens; prompt+gen/s adds the prompt tokens prefilled. Texts differing: "
        "greedy outputs unlike the first mode's (speclm's AR) for the same requests.",
        "",
        "| mode | concurrency | requests | tokens/s | vs concurrency 1 | vs first mode | prompt+gen tokens/s | "
        "TTFT p50 (s) | TTFT p99 (s) | ITL p50 (ms) | ITL p99 (ms) | texts differing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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
                f"{r['ttft_p99']:.3f} | {1000 * r['itl_p50']:.1f} | {1000 * r['itl_p99']:.1f} | "
                f"{r.get('mismatches', '-')} |"
            )
    return "\n".join(lines) + "\n"


def time_in_process(llm, prompts: list[list[int]], max_tokens: int, on_thread: bool = False) -> dict:
    """`llm.generate` on each prompt in turn (greedy, max_tokens each), on this thread or, with `on_thread`,
    on a new thread that did not load the model (what speclm serve avoids; the ModelRunner warns)."""
    from speclm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    out: dict = {}

    def run() -> None:
        llm.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
        t0 = time.perf_counter()
        results = [llm.generate(p, params)[0] for p in prompts]
        out["seconds"] = time.perf_counter() - t0
        out["texts"] = [r.text for r in results]
        out["tokens"] = sum(len(r.token_ids) for r in results)

    if on_thread:
        thread = threading.Thread(target=run, name="speclm-bench-worker")
        thread.start()
        thread.join()
    else:
        run()
    if "seconds" not in out:
        raise RuntimeError("the in-process run failed")
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    return out


def mismatches(texts: list[str], reference: list[str]) -> int:
    """Requests whose greedy text differs from the reference's for the same request."""
    return sum(a != b for a, b in zip(texts, reference)) + abs(len(texts) - len(reference))


def inprocess_markdown(rows: dict) -> list[str]:
    """The table of `--compare-inprocess`: the same prompts in-process on the loading thread, through the
    server at concurrency 1, and (a diagnostic) in-process on another thread."""
    lines = [
        "",
        "## The server against the in-process engine",
        "",
        "The same prompts, one at a time: `LLM.generate` on the thread that loaded the model, the server at "
        "concurrency 1 (its engine on that thread, uvicorn on another), and `LLM.generate` on a worker thread "
        "that did not load the model (what the server avoids: a second OpenMP team).",
        "",
        "| mode | in-process tokens/s | server tokens/s | server / in-process | other thread tokens/s | "
        "other thread / in-process | server texts differing |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, r in rows.items():
        other = r.get("other_thread_tokens_per_s")
        lines.append(
            f"| {mode} | {r['tokens_per_s']:.1f} | {r['server_tokens_per_s']:.1f} | {r['server_vs_inprocess']:.2f}x | "
            + (f"{other:.1f} | {other / r['tokens_per_s']:.2f}x" if other else "- | -")
            + f" | {r['server_mismatches']} |"
        )
    return lines
