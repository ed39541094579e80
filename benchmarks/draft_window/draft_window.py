"""Which part of a long prompt should the draft model read? Greedy acceptance (tau) of the real pair's
0.5B draft (the `draft:` defaults: Q4_0 weights, a 32768-token head) on long prompts when it reads the
whole prompt, or its first S tokens (attention sinks) plus its last W tokens, with the kept tokens at
their real positions or renumbered.

The 1.5B target's greedy continuation of each prompt is computed once (plain decoding); every window
then runs the draft proposer itself along that continuation with a fixed K, exactly as speculative
decoding would (greedy output is the target's whatever the draft reads): the drafts accepted per step
do not depend on the machine's speed. Draft prefill seconds do (measured under load: a shared 2-core VM).
Usage (needs `make pair`):

    python benchmarks/draft_window/draft_window.py --out benchmarks/draft_window
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from speclm import LLM, SamplingParams
from speclm.bench.machine import machine_info
from speclm.config import SpecConfig
from speclm.data import SPECBENCH_PROMPTS, load_prompts, pair
from speclm.speculative.factory import build_draft_proposer

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0.0)
# name -> (window, sinks, renumber); window 0 = the whole prompt
CONFIGS = {
    "full": (0, 0, False),
    "S4+W128": (128, 4, False),
    "S4+W256": (256, 4, False),
    "S4+W512": (512, 4, False),
    "S4+W1024": (1024, 4, False),
    "S4+W256 renumbered": (256, 4, True),
    "S4+W512 renumbered": (512, 4, True),
    "S0+W256": (256, 0, False),
    "S32+W256": (256, 32, False),
}
CODE_FILES = ["speclm/engine/speculation.py"]


def long_prompts(per_category: int) -> list[dict]:
    rows = load_prompts(SPECBENCH_PROMPTS, categories=["rag", "summarization"])
    chosen: list[dict] = []
    for category in ("rag", "summarization"):
        chosen += sorted(
            (r for r in rows if r["category"] == category and len(r["text"]) > 2000), key=lambda r: r["id"]
        )[:per_category]
    for path in CODE_FILES:
        code = (ROOT / path).read_text()
        chosen.append(
            {
                "id": path,
                "category": "code-edit",
                "text": f"Add a docstring to every function of this Python module that lacks one, and type hints "
                f"where they are missing. Answer with the whole module.\n\n```python\n{code}```",
            }
        )
    return chosen


def simulate(proposer, prompt: list[int], reference: list[int], k: int) -> dict:
    """Speculative greedy decoding along the target's known output with a fixed K (the engine's rule:
    K is at most the tokens still wanted after the pending one)."""
    proposer.start(prompt, len(prompt) + len(reference) + k + 1)
    pos, steps, drafted, accepted, prefill_s, draft_s = 1, 0, 0, 0, 0.0, 0.0
    while pos < len(reference):
        want = min(k, len(reference) - pos - 1)
        t0 = time.perf_counter()
        drafts = proposer.propose(prompt + reference[:pos], want, GREEDY, None).tokens if want else []
        seconds = time.perf_counter() - t0
        if steps == 0:
            prefill_s = seconds
        else:
            draft_s += seconds
        a = 0
        while a < len(drafts) and drafts[a] == reference[pos + a]:
            a += 1
        steps, drafted, accepted, pos = steps + 1, drafted + len(drafts), accepted + a, pos + a + 1
    return {
        "steps": steps,
        "tokens": len(reference) - 1,
        "drafted": drafted,
        "accepted": accepted,
        "first_propose_seconds": prefill_s,
        "later_propose_seconds": draft_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/draft_window")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target_path, draft_path = (str(pair.pair_dir() / pair.PAIR[r].name) for r in ("target", "draft"))
    llm = LLM(target_path)
    base = build_draft_proposer(SpecConfig("draft", draft_path), llm.model.config.vocab_size)
    prompts = long_prompts(args.per_category)
    cache_file = out / "references.json"  # the target's greedy continuations (slow to compute under load)
    references = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    records = []
    for p in prompts:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": p["text"]}])
        key = f"{p['id']}:{args.max_tokens}"
        if key not in references:
            t0 = time.perf_counter()
            references[key] = llm.generate(ids, params)[0].token_ids
            print(
                f"{p['category']} {p['id']}: {len(ids)} prompt tokens, AR {time.perf_counter() - t0:.1f} s", flush=True
            )
            cache_file.write_text(json.dumps(references))
        for name in args.configs.split(","):
            window, sinks, renumber = CONFIGS[name]
            proposer = base.for_another_engine()  # an empty prompt memo: every prefill is measured whole
            proposer.window, proposer.sinks, proposer.renumber = window, sinks, renumber
            r = simulate(proposer, ids, references[key], args.k)
            r.update({"prompt_id": p["id"], "category": p["category"], "prompt_tokens": len(ids), "config": name})
            records.append(r)
            print(
                f"  {name:22s} tau {r['tokens'] / r['steps']:.2f}  prefill {r['first_propose_seconds']:.2f} s",
                flush=True,
            )
    result = {"machine": machine_info(), "k": args.k, "max_tokens": args.max_tokens, "records": records}
    (out / "draft_window.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
