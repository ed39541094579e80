"""torch's cuBLAS settings on the GEMMs of a batch-1 CUDA-graph step of Qwen2.5-1.5B's shapes (32 rows: the
batch-invariant chunk; column-major weights, as the GPU path holds them): GPU us per call under each setting
(bf16 reduced-precision reductions on or off; the cuBLAS or cuBLASLt library), a step's GEMMs in ms, and
whether a setting keeps the default's bits. A diagnostic beside bench_gemm.py (issue 32).

    python benchmarks/cuda/bench_blas_settings.py --out DIR      (on the GPU machine)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import QWEN_1_5B, card  # noqa: E402
from bench_gemm import STREAM_BYTES, shapes  # noqa: E402
from bench_splitk import gpu_us_per_call  # noqa: E402

SETTINGS = ("default", "fp32_reductions", "cublaslt", "cublaslt_fp32_reductions")


def apply(setting: str) -> None:
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = "fp32_reductions" not in setting
    torch.backends.cuda.preferred_blas_library("cublaslt" if setting.startswith("cublaslt") else "cublas")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/blas_settings")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    results = {"card": card(device)[0], "rows": 32, "projections": {}}
    step = dict.fromkeys(SETTINGS, 0.0)
    for name, (out_features, in_features) in shapes(QWEN_1_5B).items():
        copies = max(1, STREAM_BYTES // (2 * out_features * in_features))
        # [in, out] contiguous: the transpose of a column-major [out, in] weight, as column_major_weights holds it
        weights = [torch.randn(in_features, out_features, generator=g).to(torch.bfloat16) for _ in range(copies)]
        weights = [w.to(device) for w in weights]
        x = torch.randn(32, in_features, generator=g).to(torch.bfloat16).to(device)
        turn = [0]

        def call():
            turn[0] = (turn[0] + 1) % copies
            return x @ weights[turn[0]]

        row, base = {}, None
        for setting in SETTINGS:
            apply(setting)
            turn[0] = -1
            out = call()
            base = out if base is None else base
            us = gpu_us_per_call(call, device)
            row[setting] = {"us": round(us, 2), "default_bits": bool(torch.equal(out, base))}
            step[setting] += us * (1 if name == "lm_head" else QWEN_1_5B["num_hidden_layers"]) / 1e3
        apply("default")
        results["projections"][name] = row
        print(name, json.dumps(row), flush=True)
    results["step_ms"] = {k: round(v, 3) for k, v in step.items()}
    print("step ms", json.dumps(results["step_ms"]), flush=True)
    with open(os.path.join(args.out, "blas_settings.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
