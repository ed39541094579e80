"""`speclm bench --compare`: speclm's weight formats against llama.cpp and transformers in one run."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import torch

from speclm.llm import LLM
from speclm.models.attention import AttentionMetadata
from speclm.sampling_params import SamplingParams

# A fixed text for perplexity (written for this benchmark, not from any data set).
PERPLEXITY_TEXT = (
    "The library opens at nine in the morning and closes at six in the evening. On weekdays, students come "
    "to read, to study for their exams, and to borrow books for their classes. The quiet room on the second "
    "floor is the most popular place, because it has large windows and long wooden tables. On Saturdays, "
    "the library holds a reading hour for children, where a volunteer reads a story aloud and the children "
    "draw pictures of their favourite characters. Many families say that this hour is the best part of "
    "their week, and some of the children who came years ago now work at the library themselves."
)


class SpeclmEngine:
    """One speclm configuration (weight format x decoding method) behind the peers' interface."""

    def __init__(self, llm: LLM, spec: str | None, k: int | None) -> None:
        self.llm = llm.with_spec(spec, k) if spec else llm.with_spec(None)
        self.name = f"speclm {llm.weights.label} " + (spec or "ar")

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        out = self.llm.generate(prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
        return out.token_ids, time.perf_counter() - t0


def first_divergence(a: list[int], b: list[int]) -> int:
    """Index of the first differing token (the common length if one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def time_engines(
    engines: list, prompt_ids: list[list[int]], max_tokens: int, repeats: int, progress=print
) -> list[dict]:
    """Every engine on every prompt, interleaved (repeat > prompt > engine) so drifts in the shared
    machine's load hit all engines alike. One warm-up generation per engine first."""
    for engine in engines:
        engine.generate(prompt_ids[0], 4)
    records = []
    for r in range(repeats):
        for i, ids in enumerate(prompt_ids):
            for engine in engines:
                tokens, seconds = engine.generate(ids, max_tokens)
                records.append(
                    {
                        "engine": engine.name,
                        "repeat": r,
                        "prompt": i,
                        "tokens": len(tokens),
                        "seconds": seconds,
                        "token_ids": tokens,
                    }
                )
            progress(f"repeat {r + 1}/{repeats}, prompt {i + 1}/{len(prompt_ids)} done")
    return records


def summarize(records: list[dict], reference: str, baseline: str | None) -> dict[str, dict]:
    """Per engine: median over repeats of tokens/s (all prompts of a repeat pooled), its ratio to the
    baseline's median, and greedy agreement with the reference engine (first divergence per prompt)."""
    per_repeat: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for rec in records:
        acc = per_repeat[rec["engine"]][rec["repeat"]]
        acc[0] += rec["tokens"]
        acc[1] += rec["seconds"]
    ref_ids = {rec["prompt"]: rec["token_ids"] for rec in records if rec["engine"] == reference and rec["repeat"] == 0}
    summary = {}
    for name, repeats in per_repeat.items():
        rates = [tokens / seconds for tokens, seconds in repeats.values()]
        divergence = [
            first_divergence(rec["token_ids"], ref_ids[rec["prompt"]])
            for rec in records
            if rec["engine"] == name and rec["repeat"] == 0
        ]
        summary[name] = {
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_runs": rates,
            "first_divergence": divergence,
        }
    base = summary.get(baseline, {}).get("tokens_per_s") if baseline else None
    for s in summary.values():
        s["ratio_to_baseline"] = s["tokens_per_s"] / base if base else None
    return summary


def perplexity(llm: LLM, text: str = PERPLEXITY_TEXT) -> float:
    """Perplexity of `text` under the model (teacher-forced, one forward pass)."""
    ids = llm.tokenizer.encode(text)
    model = llm.model
    cache = model.new_cache(len(ids))
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), cache, AttentionMetadata(0, len(ids)))
    logits = model.compute_logits(hidden[:-1])  # [len(ids) - 1, vocab]
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).exp())


def verification_cost(llm: LLM, max_k: int = 8, context: int = 128, reps: int = 9) -> dict:
    """Seconds of one target pass over K+1 tokens (plus logits for all of them, as verification
    needs) divided by a 1-token pass, for K = 1..max_k, at a fixed context length. Medians."""
    model = llm.model
    cache = model.new_cache(context + max_k + 1)
    ids = [(7 * i) % 1000 + 100 for i in range(context + max_k + 1)]
    model(torch.tensor(ids[:context]), torch.arange(context), cache, AttentionMetadata(0, context))

    def step(n: int) -> float:
        t0 = time.perf_counter()
        hidden = model(
            torch.tensor(ids[context : context + n]),
            torch.arange(context, context + n),
            cache,
            AttentionMetadata(context, n),
        )
        model.compute_logits(hidden)
        return time.perf_counter() - t0

    times: dict[int, list[float]] = defaultdict(list)
    for n in range(1, max_k + 2):
        step(n)  # warm-up of each shape
    for _ in range(reps):
        for n in range(1, max_k + 2):  # interleaved, like the engines
            times[n].append(step(n))
    single = statistics.median(times[1])
    return {
        "single_token_ms": single * 1e3,
        "ratio": {k: statistics.median(times[k + 1]) / single for k in range(1, max_k + 1)},
    }


def _kernel_times(run, steps: int) -> dict[str, tuple[float, float]]:
    """speclm kernel name -> (ms per token, calls per token) while `run()` decodes `steps` tokens,
    from cProfile (torch.profiler does not see the C++ extension's calls)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(run)
    out = {}
    for (_, _, name), (_, calls, tottime, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        if "speclm_cpu_kernels" in name:
            kernel = name.rsplit(".", 1)[-1].rstrip(">}")
            out[f"speclm::{kernel}"] = (tottime / steps * 1e3, calls / steps)
    return out


def decode_profile(llm: LLM, steps: int = 16, top: int = 10) -> dict:
    """Where one decode step's time goes: torch.profiler self CPU time per op, per token, plus the
    time in speclm's C++ kernels (cProfile, a second pass over as many tokens)."""
    from torch.profiler import ProfilerActivity, profile

    model = llm.model
    cache = model.new_cache(64 + 2 * steps)
    model(torch.arange(100, 164), torch.arange(64), cache, AttentionMetadata(0, 64))

    def decode(first: int) -> None:
        for i in range(steps):
            pos = first + i
            model.compute_logits(model(torch.tensor([100 + i]), torch.tensor([pos]), cache, AttentionMetadata(pos, 1)))

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode(64)
    wall = (time.perf_counter() - t0) / steps
    kernels = _kernel_times(lambda: decode(64 + steps), steps)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_ops = sum(e.self_cpu_time_total for e in ops) / steps / 1e3  # ms per token inside aten ops
    matmul = sum(e.self_cpu_time_total for e in ops if "mm" in e.key or "linear" in e.key) / steps / 1e3
    return {
        "wall_ms_per_token_profiled": wall * 1e3,
        "aten_ms_per_token": total_ops,
        "matmul_ms_per_token": matmul,
        "kernel_ms_per_token": sum(ms for ms, _ in kernels.values()),
        "aten_calls_per_token": sum(e.count for e in ops) / steps,
        "kernels": [
            {"op": k, "ms_per_token": ms, "calls_per_token": calls}
            for k, (ms, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])
        ],
        "top_ops": [
            {"op": e.key, "ms_per_token": e.self_cpu_time_total / steps / 1e3, "calls_per_token": e.count / steps}
            for e in ops[:top]
        ],
    }


RSS_SNIPPETS = {
    "speclm": (
        "import torch; from speclm import LLM, SamplingParams; "
        "llm = LLM({model!r}, weights={weights!r}, threads={threads}); "
        "llm.generate([1, 2, 3], SamplingParams(max_tokens=16, ignore_eos=True))"
    ),
    # without importing speclm (and so torch): llama.cpp's own footprint
    "llama.cpp": (
        "import itertools; from llama_cpp import Llama; "
        "llama = Llama({model!r}, n_threads={threads}, verbose=False); "
        "list(itertools.islice(llama.generate([1, 2, 3], top_k=1, temp=0.0), 16))"
    ),
    "transformers": (
        "from speclm.bench.peers import TransformersPeer; TransformersPeer({model!r}).generate([1, 2, 3], 16)"
    ),
}


def peak_rss_mb(kind: str, model: str, threads: int, weights: str = "fp32") -> float:
    """Peak resident memory of a fresh process that loads one engine and generates 16 tokens."""
    code = RSS_SNIPPETS[kind].format(model=model, weights=weights, threads=threads)
    code += "; print([int(x.split()[1]) / 1024 for x in open('/proc/self/status') if x.startswith('VmHWM:')][0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def self_peak_rss_mb() -> float:
    """This process's peak RSS in MB: VmHWM, which execve resets (getrusage's ru_maxrss carries
    the forking parent's peak into a child, so it would report the benchmark process's size)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
