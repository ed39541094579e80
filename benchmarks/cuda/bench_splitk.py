"""Split-K against the single-pass paged-attention kernel on Qwen2.5-1.5B's attention shape (issue 32).

    python benchmarks/cuda/bench_splitk.py --out DIR        # on the GPU machine (run_gpu.sh splitk)
    python benchmarks/cuda/bench_splitk.py --device cpu --tiny --out /tmp/s   # a smoke run (TRITON_INTERPRET=1)

1. kernel: one layer's attention (12 query heads, 2 KV heads, head_dim 128, bf16), GPU time per call from a
   CUDA graph of CALLS calls, for contexts of CONTEXTS keys, in two layouts: "eager" (the row alone, its
   table as wide as its context: a batch-1 eager step) and "graph" (the row among 31 padded rows of one key,
   the table 32768 wide: a batch-1 CUDA-graph step, whose table is as wide as the model's context); the
   single pass (partition 0) against split-K at PARTITIONS keys per partition (and at 256 with OTHER_PROGRAMS
   programs a launch), with the largest difference to the torch reference.
2. decode: batch-1 greedy decode of the random 1.5B model (bf16, CUDA graphs, batch-invariant GEMMs) after
   prompts of PROMPTS tokens: the median time of a decode step (a target pass with its logits on the host)
   with split-K (PARTITION_KEYS) and with the single pass, each variant with its own runner (graphs captured
   under its setting), and how many generated tokens the two agree on.
Writes DIR/splitk_bench.json and DIR/splitk_bench.md.
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
from bench_cuda import QWEN_1_5B, TINY, card, llm_from_model, random_pair  # noqa: E402

CONTEXTS = (160, 512, 2048, 8192)  # 160: bench_cuda's batch-1 run (a 32-token prompt, 128 new tokens)
PARTITIONS = (0, 64, 128, 256, 512)  # 0: the single pass
PROMPTS = (32, 2048)
OTHER_PROGRAMS = 512  # split-K programs a launch aims at, against SPLIT_PROGRAMS (the p256/512 column)
CALLS, NEW_TOKENS, GRAPH_WIDTH, GRAPH_ROWS = 50, 64, 32768, 32


def kernel_case(context: int, layout: str, heads: int, kv: int, dim: int, device, dtype, tiny: bool):
    """(q, keys, values, lengths, table, table_rows) of one real row of `context` keys in `layout`."""
    g = torch.Generator().manual_seed(context)
    rows = 1 if layout == "eager" else (4 if tiny else GRAPH_ROWS)
    width = context if layout == "eager" else (2 * context if tiny else GRAPH_WIDTH)
    slots = context + 1  # (the last one: the padded rows' key, the padding of the table)
    table = torch.full((rows, width), slots - 1)
    table[0, :context] = torch.randperm(slots - 1, generator=g)
    lengths = torch.ones(rows, dtype=torch.long)
    lengths[0] = context
    q = torch.randn(heads, rows, dim, generator=g).to(dtype)
    keys, values = (torch.randn(kv, slots, dim, generator=g).to(dtype) for _ in range(2))
    return [t.to(device) for t in (q, keys, values, lengths, table, torch.arange(rows))]


def gpu_us_per_call(fn, device: torch.device) -> float:
    """GPU microseconds per call of fn, from a CUDA graph of CALLS calls (no launch cost from the host)."""
    fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(1e3 * start.elapsed_time(end) / CALLS)
    return min(times)


def kernel_part(device: torch.device, tiny: bool) -> list[dict]:
    from speclm.kernels import triton_attention
    from speclm.kernels.triton_attention import paged_attention
    from speclm.models.gpu_attention import attend_rows_reference

    heads, kv, dim = (4, 2, 16) if tiny else (12, 2, 128)
    dtype = torch.float16 if device.type == "cpu" else torch.bfloat16  # (the interpreter has no bf16)
    rows, default_programs = [], triton_attention.SPLIT_PROGRAMS
    for context in (17, 70) if tiny else CONTEXTS:
        for layout in ("eager", "graph"):
            q, keys, values, lengths, table, table_rows = kernel_case(
                context, layout, heads, kv, dim, device, dtype, tiny
            )
            reference = attend_rows_reference(
                q[:, :1], keys, values, lengths[:1], table[:1, :context], table_rows[:1], dim**-0.5
            )
            row = {"context": context, "layout": layout, "table_width": table.shape[1], "rows": len(lengths)}
            cases = [(p, None) for p in ((0, 32) if tiny else PARTITIONS)] + [(32 if tiny else 256, OTHER_PROGRAMS)]
            for partition, programs in cases:

                def call(p=partition):
                    return paged_attention(q, keys, values, lengths, table, table_rows, dim**-0.5, partition=p)

                triton_attention.SPLIT_PROGRAMS = programs or default_programs
                try:
                    err = (call()[:, :1].float() - reference.float()).abs().max().item()
                    us = gpu_us_per_call(call, device)
                finally:
                    triton_attention.SPLIT_PROGRAMS = default_programs
                row[f"p{partition}" + (f"/{programs}" if programs else "")] = {"us": round(us, 2), "max_err": err}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


class StepClock:
    """Wraps a runner's forward (the engine's step): each call's wall time (up to the step's one
    synchronisation: the logits, or a static step's argmax, on the host)."""

    def __init__(self, runner) -> None:
        self.inner, self.seconds = runner.forward, []
        runner.forward = self

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.seconds.append(time.perf_counter() - t0)
        return out


def decode_part(device: torch.device, tiny: bool) -> list[dict]:
    from speclm import SamplingParams
    from speclm.kernels import triton_attention

    hf, llm = random_pair(TINY if tiny else QWEN_1_5B, device)
    del hf
    default, by_default = triton_attention.PARTITION_KEYS, triton_attention.SPLIT_K_BY_DEFAULT
    vocab, new = llm.model.config.vocab_size, 8 if tiny else NEW_TOKENS
    rows = []
    for prompt_len in (8, 40) if tiny else PROMPTS:
        prompt = torch.randint(1, vocab, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
        row, tokens = {"prompt_len": prompt_len, "new_tokens": new}, {}
        for label, partition in (("split", 16 if tiny else default), ("single", 0)):
            triton_attention.PARTITION_KEYS, triton_attention.SPLIT_K_BY_DEFAULT = partition, True
            try:
                run = llm_from_model(llm.model, llm.tokenizer, "auto", True)
                run.generate([prompt[:8]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up, capture
                clock = StepClock(run.runner)
                out = run.generate([prompt], SamplingParams(max_tokens=new, ignore_eos=True))[0]
                graphs = run.runner.decode_graphs(run.engine.cache)
            finally:
                triton_attention.PARTITION_KEYS, triton_attention.SPLIT_K_BY_DEFAULT = default, by_default
            steps = clock.seconds[-(new - 1) :]  # (the prompt's last chunk yields the first token)
            tokens[label] = out.token_ids
            row[label] = {
                "partition": partition,
                "decode_step_ms_median": round(1e3 * statistics.median(steps), 3),
                "decode_step_ms_mean": round(1e3 * statistics.mean(steps), 3),
                "graph_steps": graphs.steps if graphs is not None else 0,
            }
        row["split_vs_single_step_ratio"] = round(
            row["split"]["decode_step_ms_median"] / row["single"]["decode_step_ms_median"], 3
        )
        same = sum(a == b for a, b in zip(tokens["split"], tokens["single"]))
        row["tokens_agreeing"] = f"{same}/{len(tokens['single'])}"
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Split-K paged attention on {report['card']} ({report['date']})", "", f"Command: `{report['command']}`"]
    if report.get("kernel"):
        parts = [k for k in report["kernel"][0] if k.startswith("p")]
        lines += ["", "## Kernel: GPU us per call (max abs error against the reference)", ""]
        lines += [
            "| context | layout | rows | width | " + " | ".join("single" if p == "p0" else p for p in parts) + " |"
        ]
        lines += ["|---" * (4 + len(parts)) + "|"]
        for r in report["kernel"]:
            cells = " | ".join(f"{r[p]['us']:.2f} ({r[p]['max_err']:.1e})" for p in parts)
            lines.append(f"| {r['context']} | {r['layout']} | {r['rows']} | {r['table_width']} | {cells} |")
    if report.get("decode"):
        lines += ["", "## Batch-1 decode, random Qwen2.5-1.5B (bf16, CUDA graphs): median step ms", ""]
        lines += ["| prompt | split-K | single pass | split / single | tokens agreeing |", "|---|---|---|---|---|"]
        for r in report["decode"]:
            lines.append(
                f"| {r['prompt_len']} | {r['split']['decode_step_ms_median']} (p{r['split']['partition']}) | "
                f"{r['single']['decode_step_ms_median']} | {r['split_vs_single_step_ratio']} | {r['tokens_agreeing']} |"
            )
    return "\n".join(lines + [""])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run of the code, any device)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--parts", default="kernel,decode")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {args.device}, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    report = {
        "card": card(device)[0],
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", "benchmarks/cuda/bench_splitk.py"] + sys.argv[1:]),
    }
    os.makedirs(args.out, exist_ok=True)
    for part, run in (("kernel", kernel_part), ("decode", decode_part)):
        if part in args.parts.split(","):
            report[part] = run(device, args.tiny)
            with open(os.path.join(args.out, "splitk_bench.json"), "w") as f:  # written after every part
                json.dump(report, f, indent=1)
            with open(os.path.join(args.out, "splitk_bench.md"), "w") as f:
                f.write(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
