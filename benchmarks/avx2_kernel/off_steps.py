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
import time

from speclm import LLM, SamplingParams
from speclm.bench.machine import machine_info
from speclm.data.pair import pair_path
from speclm.speculative import controller as controller_module
from speclm.speculative import draft_model as draft_module
from speclm.speculative import hybrid as hybrid_module

COLUMNS = ("prompt_tokens", "tokens", "seconds", "prefill_seconds", "decode_seconds", "decode_steps", "tau")
COLUMNS += ("proposer_seconds", "target_seconds", "drafted_tokens", "k_chosen", "reads", "sources", "same_as_plain")
WARM_UP = "Write a Python function that returns the n-th Fibonacci number."


class Trace:
    """Patches the K controller, the draft model's catch-ups and the hybrid's choice to record them."""

    def __init__(self) -> None:
        self.chosen: list[int] = []
        self.reads: list[tuple[int, float]] = []  # (tokens, seconds) of each draft-model read of 2+ tokens
        self.sources: collections.Counter = collections.Counter()
        self.saved = []

    def patch(self, owner, name, wrapper) -> None:
        original = getattr(owner, name)
        self.saved.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> Trace:
        def next_k(original):
            def f(controller):
                k = original(controller)
                self.chosen.append(k)
                return k

            return f

        def feed(original):
            def f(proposer, tokens):
                t0 = time.perf_counter()
                out = original(proposer, tokens)
                if len(tokens) > 1:
                    self.reads.append((len(tokens), time.perf_counter() - t0))
                return out

            return f

        def propose(original):
            def f(proposer, *args):
                before = dict(proposer.proposals)
                out = original(proposer, *args)
                for source, n in proposer.proposals.items():
                    self.sources[source] += n - before[source]
                if proposer.lookup_only:
                    self.sources["lookup_only"] = 1
                return out

            return f

        self.patch(controller_module.SpeculationController, "next_k", next_k)
        self.patch(draft_module.DraftModelProposer, "_feed", feed)
        self.patch(hybrid_module.HybridProposer, "propose", propose)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)


def run(target: str, spec: str | None, text: str, max_tokens: int, warm: bool) -> dict:
    llm = LLM(target, threads=2, spec=spec)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if warm:  # a request before: the engine has measured its passes, as a server's has
        llm.chat([{"role": "user", "content": WARM_UP}], SamplingParams(max_tokens=64, temperature=0.0))
    with Trace() as trace:
        out = llm.chat([{"role": "user", "content": text}], greedy)
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
        "k_chosen": dict(sorted(collections.Counter(trace.chosen).items())),
        "reads": f"{sum(n for n, _ in trace.reads)} tokens in {len(trace.reads)}, "
        f"{sum(t for _, t in trace.reads):.2f} s",
        "sources": dict(trace.sources),
        "text": out[0].text if isinstance(out, list) else out.text,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--category", default="rag")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmarks/avx2_kernel")
    p.add_argument("--index", type=int, default=0, help="which prompt of the category (0: the first)")
    p.add_argument("--spec", action="append", help="a --spec to run besides plain (repeatable; default: draft)")
    p.add_argument("--warm", action="store_true", help="run a short request on each engine first, as a server has")
    args = p.parse_args()
    target, draft = pair_path("target"), pair_path("draft")
    if target is None or draft is None:
        p.error("the real pair is not fetched: make pair")
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "speclm", "data", "specbench_dev.jsonl")) as f:
        row = [r for r in map(json.loads, f) if r.get("category") == args.category][args.index]
    specs = [None] + [s.replace("DRAFT", draft) for s in (args.spec or ["draft:DRAFT"])]
    rows = [run(target, spec, row["turns"][0], args.max_tokens, args.warm) for spec in specs]
    for r in rows:
        r["same_as_plain"] = r["text"] == rows[0]["text"]
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "text"}), flush=True)
    command = "python benchmarks/avx2_kernel/off_steps.py " + " ".join(sys.argv[1:])
    name = os.path.join(args.out, f"off_steps_{args.category}{args.index or ''}{'_warm' if args.warm else ''}")
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
