"""Where a speculative step of the real pair goes on a CPU: the 0.5B draft and the 1.5B target decoding alone
(ms a token, best of two), then the pair with the `draft:` defaults on one code prompt, 256 tokens, greedy: the
target's verification passes, the draft's proposing (catch-up and drafts) and the rest, per step.
Usage (needs `make pair`):

    python benchmarks/draft_layers/step_anatomy.py --out benchmarks/draft_layers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from speclm import LLM, SamplingParams
from speclm.bench.machine import machine_info

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from draft_layers import fetched_pair  # noqa: E402

PROMPT = (
    "Write a Python function that parses a CSV file with a header row and returns a list of dicts, "
    "converting numeric fields to int or float."
)


def chat(llm, tokens: int):
    t0 = time.perf_counter()
    out = llm.chat([{"role": "user", "content": PROMPT}], SamplingParams(max_tokens=tokens, ignore_eos=True))
    return out, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/draft_layers")
    args = parser.parse_args()
    target, draft = fetched_pair()
    alone = {}
    for name, path in (("draft", draft), ("target", target)):
        llm = LLM(model=path, threads=2)
        chat(llm, 8)
        alone[name] = 1e3 * min(chat(llm, 96)[1] for _ in range(2)) / 96  # ms a token
    llm = LLM(model=target, threads=2, spec=f"draft:{draft}")
    chat(llm, 8)
    out, seconds = chat(llm, 256)
    s = out.stats
    steps = s.decode_steps
    step = {
        "tokens_per_s": 256 / seconds,
        "steps": steps,
        "tau": s.decode_tokens / steps,
        "drafts_per_step": s.drafted_tokens / steps,
        "acceptance": s.accepted_tokens / s.drafted_tokens,
        "target_ms_per_step": 1e3 * s.target_seconds / steps,
        "draft_ms_per_step": 1e3 * s.proposer_seconds / steps,
        "rest_ms_per_step": 1e3 * (seconds - s.prefill_seconds - s.target_seconds - s.proposer_seconds) / steps,
    }
    command = "python benchmarks/draft_layers/step_anatomy.py --out " + args.out
    result = {"command": command, "machine": machine_info(), "alone_ms_per_token": alone, "speculative": step}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "step_anatomy.json").write_text(json.dumps(result, indent=1))
    m = result["machine"]
    md = [
        "# A speculative step of the real pair on a CPU: qwen2.5-coder-1.5b Q4_K_M with its 0.5B draft", "",
        f"Command: `{command}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} (2 threads)", "",
        f"- Decoding alone, ms a token (96 tokens, best of two): draft {alone['draft']:.1f}, target "
        f"{alone['target']:.1f}.",
        f"- The pair (`draft:` defaults), one code prompt, 256 tokens: {step['tokens_per_s']:.1f} tokens/s, "
        f"{steps} steps, tau {step['tau']:.2f}, {step['drafts_per_step']:.2f} drafts a step, acceptance "
        f"{step['acceptance']:.2f}; a step: target {step['target_ms_per_step']:.1f} ms, draft "
        f"{step['draft_ms_per_step']:.1f} ms, the rest {step['rest_ms_per_step']:.1f} ms.",
    ]  # fmt: skip
    (out_dir / "step_anatomy.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
