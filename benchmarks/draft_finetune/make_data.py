"""Step 1 of the draft fine-tuning experiment: the target's greedy responses (256 tokens) and post-norm
features for the training prompts, cached by speclm.distill.data.load_or_build."""

import argparse
import json
import os
import time

from speclm.distill.data import DataSettings, load_or_build
from speclm.distill.prompts import OWN_PROMPTS, split_specbench
from speclm.llm import LLM

HERE = os.path.dirname(os.path.abspath(__file__))


def training_prompts(specbench: str, coding: str) -> list[str]:
    """Our code prompts, Spec-Bench outside the benchmark's split, and OWN_PROMPTS minus any prompt
    that opens like one of the served benchmark's code prompts (coding_prompts.jsonl)."""
    with open(os.path.join(HERE, "code_prompts.txt")) as f:
        code = [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    with open(coding) as f:
        bench_code = [json.loads(line)["turns"][0] for line in f]
    own = [p for p in OWN_PROMPTS if not any(b.startswith(p[:40]) for b in bench_code)]
    return code + split_specbench(specbench)[1] + own


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--data-dir", default=os.path.expanduser("~/.cache/speclm/distill_pair"))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, default=768)
    args = parser.parse_args()
    prompts = training_prompts("speclm/data/specbench_dev.jsonl", "speclm/data/coding_prompts.jsonl")
    print(f"{len(prompts)} prompts", flush=True)
    start = time.perf_counter()
    llm = LLM(args.target, weights="auto", device="cpu", threads=2)
    settings = DataSettings(args.max_new_tokens, args.max_prompt_tokens, True, 16)
    data, path = load_or_build(llm, "auto", prompts, settings, args.data_dir)
    print(f"{len(data)} sequences, {data.tokens.numel()} tokens, {time.perf_counter() - start:.0f} s: {path}")


if __name__ == "__main__":
    main()
