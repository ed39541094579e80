"""An engine in a process of its own for the peer benchmarks: JSON lines in, JSON lines out.

Run as a script (`python benchmarks/gguf_peers/llama_worker.py MODEL THREADS [DRAFT] [--context JSON]`) under any
Python that has llama-cpp-python: it imports neither speclm nor torch, so its memory and load time are llama.cpp's
own. --context passes keyword arguments to llama_cpp.Llama (e.g. '{"type_k": 0, "type_v": 0}' for an f32 KV cache):
the same model under another configuration, to measure llama.cpp's agreement with itself.
speclm's worker (benchmarks/gguf_peers/speclm_worker.py) speaks the same protocol:

  {"job": "generate", "ids": [...], "max_tokens": N} -> {"tokens": [...], "seconds": s, "first_token_at": t}
  {"job": "logits", "ids": [...], "then": [...], "candidates": [a, b]} -> {"logits": [la, lb], "top": [k, ...]}
      (the next-token logits after the prompt `ids` and the tokens `then`, computed as generation computes
      them: the prompt in one batch, then one token at a time; "top": the TOP most likely tokens)
  {"job": "memory"} -> {"peak_rss_mb": m}
A first line {"ready": true} is printed once the model is loaded.
"""

from __future__ import annotations

import json
import sys
import time


def peak_rss_mb() -> float:
    """VmHWM: this process's peak resident memory (execve resets it, unlike getrusage's ru_maxrss)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


TOP = 20  # the most likely tokens a logits job names, best first


def serve(engine) -> None:
    """Answer jobs from stdin until it closes. `engine` has generate(ids, n) -> (tokens, seconds,
    first_token_at) and logits(ids, then) -> list of next-token logits."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if job["job"] == "generate":
            tokens, seconds, first = engine.generate(job["ids"], job["max_tokens"])
            reply = {"tokens": tokens, "seconds": seconds, "first_token_at": first}
        elif job["job"] == "logits":
            logits = engine.logits(job["ids"], job.get("then", []))
            reply = {
                "logits": [float(logits[c]) for c in job["candidates"]],
                "top": sorted(range(len(logits)), key=logits.__getitem__, reverse=True)[:TOP],
            }
        else:
            reply = {"peak_rss_mb": peak_rss_mb()}
        print(json.dumps(reply), flush=True)


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python: greedy (top-k 1, no penalties), EOS ignored."""

    def __init__(
        self, model: str, threads: int, draft: str | None = None, n_ctx: int = 4096, context: dict | None = None
    ) -> None:
        from llama_cpp import Llama

        def load(path: str):
            kwargs = {"n_threads": threads, "n_threads_batch": threads, "n_ctx": n_ctx, **(context or {})}
            return Llama(path, verbose=False, **kwargs)

        self.llama = load(model)
        self.draft = load(draft) if draft else None  # loaded (its memory counted), not used for drafting here

    def generate(self, ids: list[int], max_tokens: int) -> tuple[list[int], float, float]:
        self.llama.reset()  # no prompt-prefix reuse between calls: every engine prefills
        tokens, first = [], 0.0
        t0 = time.perf_counter()
        for token in self.llama.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if not tokens:
                first = time.time()
            tokens.append(int(token))
            if len(tokens) == max_tokens:
                break
        return tokens, time.perf_counter() - t0, first

    def logits(self, ids: list[int], then: list[int]) -> list[float]:
        """The next-token logits after the prompt `ids` and the generated tokens `then`, evaluated as
        generate() does (the prompt in batches, then one token per call: llama.cpp's batched and
        one-token numerics differ, so only this path gives the logits its greedy choice was made on).
        Read from the context: Llama.scores holds them only with logits_all (n_ctx x vocab floats)."""
        import llama_cpp
        import numpy as np

        self.llama.reset()
        self.llama.eval(ids)
        for token in then:
            self.llama.eval([token])
        row = llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.llama.n_vocab(),)).tolist()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("threads", type=int)
    p.add_argument("draft", nargs="?")
    p.add_argument("--context", type=json.loads, default=None, help="more llama_cpp.Llama arguments, as JSON")
    a = p.parse_args()
    serve(LlamaCppEngine(a.model, a.threads, a.draft, context=a.context))
