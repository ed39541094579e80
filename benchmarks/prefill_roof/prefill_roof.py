"""How close the AVX2 GGUF kernel's prompt passes come to the CPU's integer roof: the target's layer-0
projections (the real pair's Qwen2.5-Coder-1.5B Q4_K_M) at M activation rows, in multiply-adds per second,
beside the most VPMADDUBSW multiply-adds the cores can do with no memory traffic (maddubs_peak.cpp, one
copy per core at once).

    python benchmarks/prefill_roof/prefill_roof.py --out benchmarks/prefill_roof
Writes prefill_roof.json and .md. Needs `make pair`, g++ and an AVX2 CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from speclm import LLM
from speclm.bench.machine import machine_info
from speclm.data.pair import pair_path
from speclm.models.gguf_weights import GGUFLinear

HERE = os.path.dirname(os.path.abspath(__file__))


def peak(copies: int) -> float:
    """GMAC/s of `copies` maddubs_peak processes run at once, summed."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "peak")
        subprocess.run(["g++", "-O3", "-mavx2", os.path.join(HERE, "maddubs_peak.cpp"), "-o", exe], check=True)
        runs = [subprocess.Popen([exe], stdout=subprocess.PIPE, text=True) for _ in range(copies)]
        return sum(float(p.communicate()[0].split()[0]) for p in runs)


def layer_rates(llm: LLM, rows: list[int], seconds: float) -> dict[int, float]:
    """GMAC/s of layer 0's projections (qkv, o, gate_up, down) at each row count."""
    layers = [m for n, m in llm.model.named_modules() if isinstance(m, GGUFLinear) and n.startswith("layers.0.")]
    rates = {}
    for m_rows in rows:
        total_time, macs = 0.0, 0
        for layer in layers:
            x = torch.randn(m_rows, layer.in_features, generator=torch.Generator().manual_seed(m_rows))
            op = layer.op()
            op(x)
            reps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / len(layers):
                op(x)
                reps += 1
            total_time += (time.perf_counter() - t0) / reps
            macs += m_rows * layer.in_features * layer.out_features
        rates[m_rows] = macs / total_time / 1e9
    return rates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/prefill_roof")
    p.add_argument("--rows", default="1,6,32,192,671")
    p.add_argument("--seconds", type=float, default=3.0, help="timing per row count")
    p.add_argument("--rounds", type=int, default=3, help="peak and kernel measured alternately this many times")
    args = p.parse_args()
    target = pair_path("target")
    if target is None:
        p.error("the real pair is not fetched: make pair")
    rows = [int(r) for r in args.rows.split(",")]
    llm = LLM(target, threads=2)
    rounds = []
    for _ in range(args.rounds):
        rounds.append({"peak_1": peak(1), "peak_2": peak(2), "kernel": layer_rates(llm, rows, args.seconds)})
        print(json.dumps(rounds[-1]), flush=True)
    command = "python benchmarks/prefill_roof/prefill_roof.py " + " ".join(sys.argv[1:])
    machine = machine_info()
    with open(os.path.join(args.out, "prefill_roof.json"), "w") as f:
        json.dump({"command": command, "machine": machine, "rounds": rounds}, f, indent=1)
    lines = [
        "# AVX2 GGUF kernel against the VPMADDUBSW roof (layer 0 of Qwen2.5-Coder-1.5B Q4_K_M)",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']},"
        " 2 threads.",
        "",
        "GMAC/s (billions of multiply-adds per second). Roof: maddubs_peak.cpp on one core, and one copy per core"
        " at once; kernel: gguf_matmul over layer 0's qkv, o, gate_up and down projections at M activation rows"
        " (M = 1 reads the weights from cache here: not a decoding step's memory-bound rate).",
        "",
        "| round | roof, 1 core | roof, 2 cores | "
        + " | ".join(f"M = {r}" for r in rows)
        + " | best M / 2-core roof |",
        "|---:|---:|---:|" + "---:|" * len(rows) + "---:|",
    ]
    for i, r in enumerate(rounds, 1):
        kernel = [r["kernel"][m] for m in rows]
        lines.append(
            f"| {i} | {r['peak_1']:.1f} | {r['peak_2']:.1f} | "
            + " | ".join(f"{k:.1f}" for k in kernel)
            + f" | {max(kernel) / r['peak_2']:.2f} |"
        )
    with open(os.path.join(args.out, "prefill_roof.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
