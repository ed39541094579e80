"""The CPU path after the CUDA work: plain decoding of the default model, one thread, 64 tokens, best of 3.
Run once with PYTHONPATH at the checkout before and once at the one after (alternating, under the bench lock):

    PYTHONPATH=<checkout> flock /tmp/speclm_bench.lock python benchmarks/cuda/cpu_check.py [--weights fp32]

(--weights: the default GGUF runs on its own grids; fp32 or bf16 dequantizes it and runs the dense layers'
Python path, the one the GPU shares.)
"""

import argparse
import json
import time

import speclm
from speclm import LLM, SamplingParams

parser = argparse.ArgumentParser()
parser.add_argument("--weights", default="auto")
llm = LLM(threads=1, weights=parser.parse_args().weights)
params = SamplingParams(max_tokens=64, ignore_eos=True)
prompt = "Write a short story about a robot."
llm.generate(prompt, SamplingParams(max_tokens=8))  # warm-up
best = 0.0
for _ in range(3):
    t0 = time.perf_counter()
    out = llm.generate(prompt, params)[0]
    best = max(best, 64 / (time.perf_counter() - t0))
print(json.dumps({"src": speclm.__file__, "best_tokens_per_s": round(best, 2), "tokens": out.token_ids[:8]}))
