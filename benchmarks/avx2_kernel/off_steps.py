"""Where a draft's request loses to plain decoding on one Spec-Bench prompt: plain and `draft:` in-process on
the real pair (greedy), with the K the controller chose each step, and the time the proposer took in all
(drafting and catching up on tokens of steps without drafts).

    python benchmarks/avx2_kernel/off_steps.py --category rag --out benchmarks/avx2_kernel
Writes off_steps_CATEGORY.json and .md. Needs `make pair`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from speclm import LLM, SamplingParams
from speclm.bench.machine import machine_info
from speclm.data.pair import pair_path
from speclm.speculative import controller as controller_module

COLUMNS = ("prompt_tokens", "tokens", "seconds", "prefill_seconds", "decode_seconds", "decode_steps", "tau")
COLUMNS += ("proposer_seconds", "target_seconds", "drafted_tokens", "k_chosen")


def run(target: str, spec: str | None, text: str, max_tokens: int) -> dict:
    chosen: list[int] = []
    original = controller_module.SpeculationController.next_k

    def next_k(self) -> int:
        k = original(self)
        chosen.append(k)
        return k

    controller_module.SpeculationController.next_k = next_k
    try:
        llm = LLM(target, threads=2, spec=spec)
        out = llm.chat([{"role": "user", "content": text}], SamplingParams(max_tokens=max_tokens, temperature=0.0))
    finally:
        controller_module.SpeculationController.next_k = original
    s = (out[0] if isinstance(out, list) else out).stats
    return {
        "spec": spec or "plain",
        "prompt_tokens": s.prompt_tokens,
        "tokens": s.completion_tokens,
        "seconds": round(s.seconds, 2),
        "prefill_seconds": round(s.prefill_seconds, 2),
        "decode_seconds": round(s.seconds - s.prefill_seconds, 2),
        "decode_steps": s.decode_steps,
        "tau": round(s.mean_accepted_length, 3),
        "proposer_seconds": round(s.proposer_seconds, 2),
        "target_seconds": round(s.target_seconds, 2),
        "drafted_tokens": s.drafted_tokens,
        "k_chosen": dict(sorted(collections.Counter(chosen).items())),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--category", default="rag")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmarks/avx2_kernel")
    args = p.parse_args()
    target, draft = pair_path("target"), pair_path("draft")
    if target is None or draft is None:
        p.error("the real pair is not fetched: make pair")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "speclm", "data", "specbench_dev.jsonl")) as f:
        row = next(r for r in map(json.loads, f) if r.get("category") == args.category)
    rows = [run(target, spec, row["turns"][0], args.max_tokens) for spec in (None, f"draft:{draft}")]
    for r in rows:
        print(json.dumps(r), flush=True)
    command = "python benchmarks/avx2_kernel/off_steps.py " + " ".join(sys.argv[1:])
    name = os.path.join(args.out, f"off_steps_{args.category}")
    with open(name + ".json", "w") as f:
        json.dump(
            {"command": command, "machine": machine_info(), "question_id": row["question_id"], "runs": rows},
            f,
            indent=1,
        )
    lines = [
        f"# plain and draft: in-process on Spec-Bench dev question {row['question_id']} ({args.category})",
        "",
        f"Command: `{command}`; machine: {machine_info()['cpu']}, 2 threads; greedy, chat template.",
        "",
        "| run | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for r in rows:
        lines.append(f"| {r['spec'].split('/')[-1]} | " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    with open(name + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
