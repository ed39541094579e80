"""Where a batch-1 decode step's time goes on a GPU, host and device side by side, and what decoding would
reach if the host's part were hidden: a diagnostic beside bench_cuda.py (same random Qwen2.5-1.5B model).

For each variant (before: every graph over the whole slot table, so split-K attention, the residual add apart
from the norm, and row-major weights, as main was at 2f5dff1; no_column_major: the engine but for the weights'
layout; engine: the code as it is) it runs 64 greedy decode steps through LLM.generate and reports medians of:
  step      the engine's whole step (schedule, run, process)
  rows      laying out the step's rows on the host (step_rows)
  load      copying them into the fixed buffers (host time of the calls)
  launch    the graph's replay call on the host
  wait      from the replay call's return to the argmax on the host (the GPU still running)
  post      the rest of the runner's work after it (the outputs' copies)
  gpu       the replay's GPU span (CUDA events around it)
then the same captured pass replayed 64 times in a chain with each row's argmax fed back on the device
(no host work between replays: the floor a pipelined or multi-step decoder approaches), with and without
reading the token back each step.

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


def timed_run(graphs, samples: list[dict]):
    """DecodeGraphs.run with timestamps (the same calls in the same order; the probe's copy)."""
    from speclm.engine.decode_graphs import step_rows

    cuda = graphs.model.device.type == "cuda"

    def run(cache, entries):
        t0 = time.perf_counter()
        rows = step_rows(entries, graphs.scratch, graphs.width, graphs.positions)
        if rows is None or graphs.failed is not None:
            return None
        graphs.model.reserve_positions(rows.max_position + 1)
        t1 = time.perf_counter()
        graphs._load(rows)
        t2 = time.perf_counter()
        if graphs.mode == "eager":
            hidden, logits, argmax = graphs._pass(cache, rows.bucket, rows.columns, rows.max_position)
            events = None
        else:
            captured = graphs._graph(cache, rows.bucket, rows.columns, rows.max_position)
            if captured is None:
                return None
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
            if events:
                events[0].record()
            t2 = time.perf_counter()
            captured.graph.replay()
            if events:
                events[1].record()
            hidden, logits, argmax = captured.hidden, captured.logits, captured.argmax
        t3 = time.perf_counter()
        graphs.steps += 1
        n = rows.num_rows
        host_argmax = argmax[:n].cpu()
        t4 = time.perf_counter()
        out = logits[:n].clone(), hidden[:n].clone(), host_argmax
        t5 = time.perf_counter()
        sample = {"rows": t1 - t0, "load": t2 - t1, "launch": t3 - t2, "wait": t4 - t3, "post": t5 - t4}
        if events:
            events[1].synchronize()
            sample["gpu"] = events[0].elapsed_time(events[1]) / 1e3
        samples.append(sample)
        return out

    return run


def timeline(llm, prompt: list[int]) -> dict:
    """64 decode steps through the engine, each timed by part (medians, ms)."""
    from speclm import SamplingParams

    graphs = llm.runner.decode_graphs(llm.engine.cache)
    llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))  # capture
    samples: list[dict] = []
    original = graphs.run
    graphs.run = timed_run(graphs, samples)
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
        llm.generate([prompt], SamplingParams(max_tokens=STEPS, ignore_eos=True))
        sync(llm.device)
        wall = time.perf_counter() - t0
    finally:
        graphs.run = original
        del llm.engine.step
    decode = samples[1:]  # (the first step after the prompt is the prompt's own: eager)
    result = {k: 1e3 * statistics.median(s[k] for s in decode) for k in decode[0]} if decode else {}
    result["step"] = 1e3 * statistics.median(steps[1:])
    result["tokens_per_s"] = STEPS / wall
    return result


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


def row_major(model, on: bool) -> None:
    """Every linear weight stored row-major ([out, in] contiguous, as before column_major_weights), or back."""
    from speclm.models.device import column_major_weights

    if not on:
        return column_major_weights(model)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = module.weight.data.contiguous()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/step_timeline")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--variants", default="before,no_column_major,engine,before,engine")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from speclm.engine import decode_graphs
    from speclm.models import layers

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
    short, fused = decode_graphs.SHORT_TABLE, layers.add_norm

    def unfused(x, delta, norm):  # (the residual add and the norm as two launches: the code before)
        x = x + delta
        return x, None if norm is None else norm(x)

    for variant in args.variants.split(","):
        # before: as main was at 2f5dff1 (every graph over the whole slot table, so split-K attention; the
        # residual add apart from the norm; row-major weights); no_column_major: the engine but for the weights
        decode_graphs.SHORT_TABLE = 0 if variant == "before" else short
        layers.add_norm = unfused if variant == "before" else fused
        if device.type == "cuda":  # (the CPU's dense kernel reads row-major weights)
            row_major(model, variant in ("before", "no_column_major"))
        llm = llm_from_model(model, tokenizer, decode_graphs=mode)
        try:
            row = timeline(llm, prompt)
            row["chained_ms"] = chained(llm, prompt, read_back=False)
            row["chained_read_ms"] = chained(llm, prompt, read_back=True)
        except Exception as e:  # (one variant failing does not lose the others)
            row = {"error": f"{type(e).__name__}: {e}"}
        results["variants"].append({"variant": variant, **row})
        print(variant, json.dumps(row), flush=True)
        llm.runner.model.use_lean_ops(gemm_rows=None)  # (the next runner sets its own)
        del llm
    decode_graphs.SHORT_TABLE, layers.add_norm = short, fused
    with open(os.path.join(args.out, "step_timeline.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
