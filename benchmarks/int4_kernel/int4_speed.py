"""speclm's int4 matmul against torch's `_weight_int4pack_mm_for_cpu` (the fallback where it is not built), on the
same grid: the default model in `--weights int4`, loaded twice (one model per layout). Its decoder layers' matmuls
back to back for M rows at a time, and greedy decoding of a few chat prompts. Each round measures every item once,
in turn.

`python benchmarks/int4_kernel/int4_speed.py --out DIR` writes DIR/int4_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time
from unittest import mock

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain how a hash map handles collisions.",
    "Summarize the plot of a story about a lost dog that finds its way home.",
]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/int4_kernel/int4_speed.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", default="1,4,9,64", help="rows per matmul call")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/int4_kernel")
    args = parser.parse_args(argv)
    import speclm.models.quant_linear as quant_linear
    from speclm.llm import LLM
    from speclm.sampling_params import SamplingParams

    kernels = quant_linear.int4_kernels(torch.device("cpu"))
    if kernels is None:
        print("error: speclm's int4 kernel is not built on this CPU (it needs AVX-512 BF16 or AVX2)", file=sys.stderr)
        return 2
    kernel_path = kernels.int4_path()
    models = {"speclm": LLM(weights="int4")}
    with mock.patch.object(quant_linear, "int4_kernels", lambda device: None):
        models["torch"] = LLM(weights="int4")
    layers = {}
    for name, llm in models.items():
        layers[name] = [m for m in llm.model.modules() if isinstance(m, quant_linear.Int4Linear)]
        assert {m.layout for m in layers[name]} == {name}, name
    rows = [int(r) for r in args.rows.split(",")]
    inputs = {m: [torch.randn(m, layer.in_features).bfloat16() for layer in layers["speclm"]] for m in rows}
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    prompts = [models["speclm"].tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    def matmuls(name: str, m: int):
        kernels = [layer.matmul_kernel() for layer in layers[name]]
        return lambda: [kernel(x) for kernel, x in zip(kernels, inputs[m])]

    def decode(name: str):
        return lambda: [models[name].generate(p, params) for p in prompts]

    items = {f"matmuls, {m} rows, {name}": matmuls(name, m) for m in rows for name in models}
    items.update({f"decode, {name}": decode(name) for name in models})
    times: dict[str, list[float]] = {}
    for round_ in range(args.rounds + 1):
        for label, fn in items.items():
            t = timed(fn)
            if round_:  # round 0 warms up
                times.setdefault(label, []).append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.tokens * len(prompts)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python benchmarks/int4_kernel/int4_speed.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    nbytes = sum(layer.weight.numel() + 2 * layer.scales_and_zeros.numel() for layer in layers["speclm"])
    table = [
        f"| {m} | {1e3 * med[f'matmuls, {m} rows, speclm']:.2f} | {1e3 * med[f'matmuls, {m} rows, torch']:.2f} "
        f"| {med[f'matmuls, {m} rows, torch'] / med[f'matmuls, {m} rows, speclm']:.2f}x |"
        for m in rows
    ]
    decode_rate = {name: tokens / med[f"decode, {name}"] for name in models}
    lines = [
        *header_lines("int4 matmul: speclm's kernel against torch's", command, machine, f"; HEAD {commit}"),
        f"SmolLM2-135M-Instruct in `--weights int4` (group 32): its {len(layers['speclm'])} decoder-layer matmuls "
        f"({nbytes / 1e6:.0f} MB of weights) back to back, M rows each. speclm's kernel runs its "
        f"{kernel_path} path. "
        f"Medians of {args.rounds} rounds.",
        "",
        "| rows | speclm ms | torch ms | speclm's speed |",
        "|---:|---:|---:|---:|",
        *table,
        "",
        f"Greedy decoding, {len(prompts)} chat prompts x {args.tokens} tokens one at a time, prefill included: "
        f"speclm's kernel {decode_rate['speclm']:.1f} tokens/s, torch's {decode_rate['torch']:.1f} tokens/s "
        f"({decode_rate['speclm'] / decode_rate['torch']:.2f}x).",
    ]
    payload = {
        "machine": machine,
        "command": command,
        "commit": commit,
        "kernel_path": kernel_path,
        "median_s": med,
        "tokens": tokens,
    }
    write_report(args.out, "int4_speed", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
