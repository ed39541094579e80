"""What a batch-1 greedy decode step costs on a GPU through the engine, against what the same captured pass
costs replayed in a chain with no host work between replays: a diagnostic beside bench_cuda.py (same random
Qwen2.5-1.5B model).

For each variant (before: as main was at 7d32a17: no step run ahead, the attention kernel's former launch plan,
the head's fp32 logits and torch's argmax inside the pass; no_ahead: the engine but for running steps ahead;
engine: the code as it is) it runs STEPS greedy tokens through LLM.generate and reports the median engine step
(schedule, run, process), tokens/s and how many steps were served from a step run ahead; then the variant's
captured pass replayed STEPS times with row 0's argmax fed back on the device (the floor for a step), with and
without reading the token back each step. (The files of 2026-11-27 before 7d32a17 came from this probe's
earlier version, which timed the runner's parts: see git history.)

    python benchmarks/cuda/step_timeline.py --out DIR            (on the GPU machine)
    python benchmarks/cuda/step_timeline.py --device cpu --tiny  (a smoke run of the same code; eager buffers)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import QWEN_1_5B, TINY, card, llm_from_model, random_pair, sync  # noqa: E402

STEPS = 64


def old_pass(graphs):
    """DecodeGraphs._pass as it was before the head's argmax kernel: the fp32 logits of every padded row made
    in the pass, and torch's argmax over them (the probe's copy)."""
    from speclm.models.static_rows import StaticRowsMetadata

    def run(cache, bucket, columns, max_position):
        v, table = graphs._inputs(bucket, columns)
        hidden = graphs.model(v[0], v[1], cache, StaticRowsMetadata(v[2], v[3], table, v[4], max_position))
        logits = graphs.model.device_logits(hidden)
        return hidden, logits, logits.argmax(-1)

    return run


def timeline(llm, prompt: list[int]) -> dict:
    """STEPS greedy tokens through the engine: the median step (schedule, run, process) and tokens/s."""
    from speclm import SamplingParams

    llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))  # capture
    steps: list[float] = []
    engine_step = llm.engine.step

    def step():
        t0 = time.perf_counter()
        out = engine_step()
        steps.append(time.perf_counter() - t0)
        return out

    llm.engine.step = step
    try:
        sync(llm.device)
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(max_tokens=STEPS, ignore_eos=True))
        sync(llm.device)
        wall = time.perf_counter() - t0
    finally:
        del llm.engine.step
    graphs = llm.runner.decode_graphs(llm.engine.cache)
    return {
        "step": 1e3 * statistics.median(steps[1:]),  # (the first step is the prompt's)
        "tokens_per_s": STEPS / wall,
        "ahead_hits": graphs.ahead_hits if graphs is not None else 0,
        "tokens": list(out[0].token_ids),
    }


def chained(llm, prompt: list[int], read_back: bool) -> float | None:
    """ms a token of the smallest bucket's graph replayed STEPS times with row 0's argmax fed back on the device
    (its position, length and write slot advanced there too), host reading the token back each step or not."""
    graphs = llm.runner.decode_graphs(llm.engine.cache)
    if graphs is None or not graphs.graphs or llm.device.type != "cuda":
        return None
    bucket, columns = min(graphs.graphs)  # (the smallest bucket over the short table)
    captured = graphs.graphs[bucket, columns]
    v, table = graphs._inputs(bucket, columns)
    start = len(prompt)
    # Row 0 reads pool slots 0.. (free after the generate calls: nothing else uses them) as a fresh sequence.
    table[0, : start + STEPS + 1] = torch.arange(start + STEPS + 1, device=v.device)
    v[:, :bucket] = 0
    v[2, :bucket], v[3, :bucket] = graphs.scratch, 1
    v[0, 0], v[1, 0], v[2, 0], v[3, 0], v[4, 0] = prompt[-1], start - 1, start - 1, start, 0
    one = torch.ones(1, dtype=torch.long, device=v.device)
    tokens = []
    sync(llm.device)
    t0 = time.perf_counter()
    for _ in range(STEPS):
        captured.graph.replay()
        v[0, :1].copy_(captured.argmax[:1])
        v[1:4, :1] += one
        if read_back:
            tokens.append(int(captured.argmax[0]))
    sync(llm.device)
    return 1e3 * (time.perf_counter() - t0) / STEPS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/step_timeline")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--variants", default="before,no_ahead,engine,before,engine")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    triton_attention = None
    if args.device != "cpu":
        from speclm.kernels import triton_attention

    device = torch.device(args.device)
    shapes = TINY if args.tiny else QWEN_1_5B
    hf, llm = random_pair(shapes, device)
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    model, tokenizer = llm.model, llm.tokenizer
    g = torch.Generator().manual_seed(0)
    prompt = [int(t) for t in torch.randint(0, shapes["vocab_size"], (32,), generator=g)]
    mode = "auto" if device.type == "cuda" else "eager"
    results = {"card": card(device)[0], "steps": STEPS, "variants": []}
    reference = None  # the first variant's tokens: every variant must give the same
    for variant in args.variants.split(","):
        # before: as main was at 7d32a17 (no step run ahead, the attention kernel's former plan, the head's
        # fp32 logits and torch's argmax in the pass); no_ahead: the engine but for running steps ahead
        llm = llm_from_model(model, tokenizer, decode_graphs=mode)
        graphs = llm.runner.decode_graphs(llm.engine.cache)
        if triton_attention is not None:
            triton_attention.PLAN = triton_attention.WIDE_ROWS_PLAN if variant == "before" else None
        if variant == "before":
            graphs._pass = old_pass(graphs)
        if variant in ("before", "no_ahead"):
            llm.engine._ahead = lambda plan: False
        try:
            row = timeline(llm, prompt)
            row["chained_ms"] = chained(llm, prompt, read_back=False)
            row["chained_read_ms"] = chained(llm, prompt, read_back=True)
        except Exception as e:  # (one variant failing does not lose the others)
            row = {"error": f"{type(e).__name__}: {e}"}
        tokens = row.pop("tokens", None)
        reference = reference if reference is not None else tokens
        row["same_tokens"] = tokens is not None and tokens == reference
        results["variants"].append({"variant": variant, **row})
        print(variant, json.dumps(row), flush=True)
        llm.runner.model.use_lean_ops(gemm_rows=None)  # (the next runner sets its own)
        del llm, graphs
    if triton_attention is not None:
        triton_attention.PLAN = None
    with open(os.path.join(args.out, "step_timeline.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
