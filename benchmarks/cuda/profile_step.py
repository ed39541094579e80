"""Where a batch-1 decode step of the Qwen2.5-1.5B-shaped random model spends its time on a GPU: torch's
profiler over 48 decode steps (CUDA graphs on), the ops by GPU time and by host time, and the GPU's busy
share of the wall time. A diagnostic beside bench_cuda.py (same model and LLM construction).

    python benchmarks/cuda/profile_step.py --out DIR     (on the GPU machine)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import QWEN_1_5B, random_pair, sync  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/profile")
    parser.add_argument("--graphs", default="auto", choices=["auto", "off"])
    parser.add_argument(
        "--partition", type=int, default=None, help="split-K attention at this many keys a partition (0: single pass)"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from torch.profiler import ProfilerActivity, profile

    from speclm import SamplingParams
    from speclm.kernels import triton_attention

    if args.partition is not None:  # (read when the graphs are captured, at the first generate)
        triton_attention.PARTITION_KEYS = args.partition or triton_attention.PARTITION_KEYS
        triton_attention.SPLIT_K_BY_DEFAULT = args.partition > 0
    label = args.graphs + ("" if args.partition is None else f"_p{args.partition}")
    device = torch.device("cuda")
    hf, llm = random_pair(QWEN_1_5B, device)
    del hf
    torch.cuda.empty_cache()
    if args.graphs == "off":
        from bench_cuda import llm_from_model

        llm = llm_from_model(llm.model, llm.tokenizer, decode_graphs="off")
    prompt = [[int(t) for t in torch.randint(0, 151936, (128,), generator=torch.Generator().manual_seed(0))]]
    llm.generate(prompt, SamplingParams(max_tokens=32, ignore_eos=True))  # warm-up, graph capture
    sync(device)
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        llm.generate(prompt, params)
        sync(device)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    lines = [
        f"graphs {args.graphs}, partition {args.partition}, {next(llm.model.parameters()).dtype}: "
        f"wall {wall * 1e3:.1f} ms for 48 tokens ({48 / wall:.1f} tokens/s); "
        f"GPU busy {gpu_us / 1e3:.1f} ms ({100 * gpu_us / 1e3 / (wall * 1e3):.0f}% of wall)",
        "== by GPU time",
        events.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60),
        "== by host time",
        events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60),
    ]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, f"profile_{label}.txt"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
