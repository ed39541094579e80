"""`speclm bench serve`: end-to-end serving throughput and latency at several concurrency levels.

Every server runs in a process of its own (`speclm serve` per decoding method, speclm/bench/speclm_server.py;
a peer's, speclm/bench/llama_server.py), all of them up at once during a level; streaming HTTP clients (in
a process of their own, serve_client.py) send the level's requests in rounds of C at once, each round to
every server in turn. Every request generates max_tokens tokens (ignore_eos; the server's usage counts
them), so throughput is tokens / the server's time in its rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from speclm.bench import serve_client
from speclm.bench.report import header_lines


@contextmanager
def serve_in_thread(app):
    """Run `app` with uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL; always stop it.
    Its engine runs on a thread of its own, not the one that loaded the model: for functional checks
    (fuzzing, invariance); timings start `speclm serve` processes (speclm/bench/speclm_server.py)."""
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


def run_levels(
    servers: dict[str, str],
    prompts: list[list[int]],
    levels: list[tuple[int, int]],
    max_tokens: int,
    between_rounds: Callable[[int, list[int]], None] | None = None,
) -> dict[str, list[dict]]:
    """Run each (concurrency, requests) level against the servers ({label: URL}, interleaved request by
    request) after a short warm-up request to each; {label: a row per level}. The clients run in a process of
    their own (speclm/bench/serve_client.py), as an application's do: in a server's process they would take
    its GIL. `between_rounds(level index, request ids)` runs before each round's requests, while the servers
    are idle: the in-process engine's turn in the same rotation."""
    job = {"servers": list(servers.items()), "prompts": prompts, "levels": levels, "max_tokens": max_tokens}
    job["sync"] = between_rounds is not None
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile("w+") as errors:
        client = subprocess.Popen(
            [sys.executable, serve_client.__file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )
        client.stdin.write(json.dumps(job) + "\n")
        client.stdin.flush()
        last = None
        try:
            for line in client.stdout:  # the caller's turns, then the results
                message = json.loads(line)
                if isinstance(message, dict) and "level" in message:
                    between_rounds(message["level"], message["ids"])
                    client.stdin.write("go\n")
                    client.stdin.flush()
                else:
                    last = message
        except BaseException:
            client.kill()
            raise
        if client.wait() != 0 or last is None:
            errors.seek(0)
            raise RuntimeError(f"the benchmark client failed: {errors.read().strip()[-1500:]}")
    return {label: [level[label] for level in last] for label in servers}  # a {label: row} per level


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


class InProcessRuns:
    """`llm.generate` on one prompt at a time (greedy, max_tokens each, EOS ignored), each timed and kept;
    the first is preceded by a short warm-up request."""

    def __init__(self, llm, max_tokens: int) -> None:
        from speclm.sampling_params import SamplingParams

        self.llm = llm
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        self.warm_up = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        self.results, self.seconds = [], []

    def run(self, prompt: list[int]) -> None:
        if self.warm_up is not None:
            self.llm.generate(prompt, self.warm_up)
            self.warm_up = None
        t0 = time.perf_counter()
        self.results.append(self.llm.generate(prompt, self.params)[0])
        self.seconds.append(time.perf_counter() - t0)

    def summary(self) -> dict:
        if not self.results:
            raise RuntimeError("the in-process run failed")
        tokens = [len(r.token_ids) for r in self.results]
        return {
            "seconds": sum(self.seconds),
            "texts": [r.text for r in self.results],
            "request_tokens": tokens,
            "request_stats": [_step_stats(r.stats) for r in self.results],
            "request_seconds": list(self.seconds),
            "tokens": sum(tokens),
            "tokens_per_s": sum(tokens) / sum(self.seconds),
        }


def time_in_process(llm, prompts: list[list[int]], max_tokens: int, on_thread: bool = False) -> dict:
    """InProcessRuns over every prompt in turn, on this thread or, with `on_thread`, on a new thread that
    did not load the model (what speclm serve avoids; the ModelRunner warns)."""
    runs = InProcessRuns(llm, max_tokens)

    def run() -> None:
        for p in prompts:
            runs.run(p)

    if on_thread:
        thread = threading.Thread(target=run, name="speclm-bench-worker")
        thread.start()
        thread.join()
    else:
        run()
    return runs.summary()


def _step_stats(stats) -> dict:
    """What a request's speed is made of (speclm/engine/request.py GenerationStats)."""
    fields = ("prefill_seconds", "decode_steps", "decode_tokens", "drafted_tokens", "accepted_tokens")
    return {f: getattr(stats, f) for f in (*fields, "proposer_seconds", "target_seconds")}


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
