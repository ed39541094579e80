"""What a draft model's read of a long prompt costs, as the share of the target's expected time for the
tokens wanted that CATCH_UP_SHARE (speclm/engine/speculation.py) is compared with: the real pair, `draft:`,
the first two rag and summarization prompts of Spec-Bench, 256 tokens, greedy, in one process.

    python benchmarks/prefill_malloc/catch_up_share.py --out benchmarks/prefill_malloc
Writes catch_up_share.json and .md. Needs `make pair`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=HERE)
    args = p.parse_args()
    from speclm import LLM, SamplingParams
    from speclm.bench.machine import machine_info
    from speclm.data.pair import pair_path
    from speclm.engine import speculation

    priced: list[dict] = []
    decide = speculation.Speculation._catch_up_pays

    def record(self, proposer, context, wanted):  # the engine's own decision, with what it weighed
        pays = decide(self, proposer, context, wanted)
        seconds, step = proposer.catch_up_seconds(context), self.costs.seconds(0)
        if seconds > 0 and step:
            priced.append({"catch_up_s": seconds, "wanted": wanted, "step_s": step, "reads": bool(pays)})
        return pays

    speculation.Speculation._catch_up_pays = record
    prompts = [json.loads(line) for line in open(os.path.join(ROOT, "speclm/data/specbench_dev.jsonl"))]
    chosen = [p for c in ("rag", "summarization") for p in [q for q in prompts if q["category"] == c][:2]]
    llm = LLM(pair_path("target"), spec=f"draft:{pair_path('draft')}", threads=2)
    llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=8, temperature=0))  # warm-up
    rows = []
    for p in chosen:
        del priced[:]
        out = llm.chat([{"role": "user", "content": p["turns"][0]}], SamplingParams(max_tokens=256, temperature=0))
        first = priced[0] if priced else None
        rows.append({"category": p["category"], "prompt_tokens": out.stats.prompt_tokens, "priced": first})
    machine = machine_info()
    command = "python benchmarks/prefill_malloc/catch_up_share.py --out benchmarks/prefill_malloc"
    with open(os.path.join(args.out, "catch_up_share.json"), "w") as f:
        entry = {"command": command, "machine": machine, "share": speculation.CATCH_UP_SHARE, "rows": rows}
        json.dump(entry, f, indent=1)
    lines = [
        "# A draft's read of a long prompt, as a share of the target's time for the tokens wanted",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        f"2 threads. CATCH_UP_SHARE was {speculation.CATCH_UP_SHARE:.4f}.",
        "",
        "share: the engine's estimate of the draft's read of the prompt over the tokens wanted times the "
        "sequence's measured plain step, the figure CATCH_UP_SHARE bounds (its first pricing per request).",
        "",
        "| category | prompt tokens | catch-up (s) | per prompt token | plain step (ms) | share | the draft reads it |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c = r["priced"]
        if c is None:
            lines.append(f"| {r['category']} | {r['prompt_tokens']} | | | | | not priced |")
            continue
        share = c["catch_up_s"] / (c["wanted"] * c["step_s"])
        per_token = c["catch_up_s"] / r["prompt_tokens"] * 1e3
        lines.append(
            f"| {r['category']} | {r['prompt_tokens']} | {c['catch_up_s']:.2f} | {per_token:.2f} ms | "
            f"{c['step_s'] * 1e3:.1f} | {share:.3f} | {'yes' if c['reads'] else 'no: lookup alone'} |"
        )
    with open(os.path.join(args.out, "catch_up_share.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
