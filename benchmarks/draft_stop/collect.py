"""Teacher-forced traces of the real pair: the 1.5B target's greedy answers (256 tokens) to the server
benchmark's chat prompts, and at each answer position the 0.5B draft's (as `draft:` builds it: its token
map and context columns) top-1 probability and whether its top-1 is the target's token.
Usage (needs `make pair`):

    python benchmarks/draft_stop/collect.py --out benchmarks/draft_stop/traces.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from speclm import LLM, SamplingParams
from speclm.config import SpecConfig
from speclm.data import pair
from speclm.models.attention import AttentionMetadata
from speclm.speculative.factory import build_draft_proposer

DATA = Path(__file__).resolve().parents[2] / "speclm" / "data"
CATEGORIES = ["code", "coding", "math_reasoning", "qa", "rag", "summarization", "translation", "extraction"]


def prompts(per_category: int) -> list[tuple[str, str]]:
    picked, seen = [], {}
    for name in ("coding_prompts.jsonl", "specbench_dev.jsonl"):
        for line in (DATA / name).open():
            row = json.loads(line)
            c = row["category"]
            if c in CATEGORIES and seen.get(c, 0) < per_category:
                seen[c] = seen.get(c, 0) + 1
                picked.append((c, row["turns"][0]))
    return picked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, draft = pair.pair_path("target"), pair.pair_path("draft")
    llm = LLM(model=target, threads=2)
    runs = []
    for category, text in prompts(args.per_category):
        messages = [{"role": "user", "content": text}]
        out = llm.chat(messages, SamplingParams(max_tokens=args.tokens, ignore_eos=True))
        runs.append({"category": category, "prompt": llm.tokenizer.encode_chat(messages), "answer": out.token_ids})
        print(category, len(runs[-1]["prompt"]), flush=True)
    vocab = llm.model.config.vocab_size
    del llm
    proposer = build_draft_proposer(SpecConfig.parse(f"draft:{draft}"), vocab).fresh()
    for run in runs:
        tokens = run["prompt"] + run["answer"]
        head = proposer.head.for_sequence()
        head.add_context(tokens)  # (every context token a column: a slight overestimate for early positions)
        model = proposer.model
        cache = model.new_cache(len(tokens))
        with torch.no_grad():
            hidden = model(torch.tensor(tokens), torch.arange(len(tokens)), cache, AttentionMetadata(0, len(tokens)))
            rows = hidden[len(run["prompt"]) - 1 : len(tokens) - 1]
            probs = torch.softmax(torch.cat([head.logits(rows[i : i + 1]) for i in range(len(rows))]).float(), -1)
        top = probs.max(-1)
        run["p_top"] = [round(float(v), 4) for v in top.values]
        run["agree"] = [int(head.token(int(i)) == t) for i, t in zip(top.indices, run["answer"], strict=True)]
        print(run["category"], sum(run["agree"]) / len(run["agree"]), flush=True)
    Path(args.out).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
