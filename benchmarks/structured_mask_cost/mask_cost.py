"""Grammar work per token on CPU: GrammarMatcher.allowed_mask (llguidance's mask + our unpacking to a
bool tensor over the vocabulary), forced_tokens and advance, along one JSON document, for the default
model's tokenizer (SmolLM2, 49k) and the real pair's (Qwen2.5, 151k). One thread; medians of 5 passes.

    PYTHONPATH=. python benchmarks/structured_mask_cost/mask_cost.py
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from speclm.models.loader import default_model_path
from speclm.structured.grammar import compile_constraint
from speclm.structured.matcher import GrammarMatcher, GrammarVocab
from speclm.tokenizer import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "authors": {"type": "array", "items": {"type": "string"}},
        "genre": {"enum": ["fiction", "non-fiction", "poetry"]},
        "rating": {"type": "number"},
    },
    "required": ["title", "year", "authors", "genre", "rating"],
    "additionalProperties": False,
}
DOCUMENT = (
    '{"title": "The Left Hand of Darkness", "year": 1969, "authors": ["Ursula K. Le Guin"], '
    '"genre": "fiction", "rating": 4.5}'
)
TOKENIZERS = {
    "SmolLM2-135M (49k)": default_model_path(),
    "Qwen2.5-Coder (151k)": os.path.expanduser("~/.cache/speclm/pair/qwen2.5-coder-0.5b-instruct-q5_0.gguf"),
}


def main() -> None:
    torch.set_num_threads(1)
    constraint = compile_constraint("json_schema", SCHEMA, "schema")
    columns = ["tokenizer", "vocab", "GrammarVocab build (s)", "tokens", "allowed_mask median (us)", "p90 (us)"]
    columns += ["forced_tokens median (us)", "advance median (us)", "tokens forced"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for name, path in TOKENIZERS.items():
        if not os.path.exists(path):
            print(f"| {name} | missing: {path} |")
            continue
        tokenizer = load_tokenizer(path)
        start = time.perf_counter()
        vocab = GrammarVocab(tokenizer)
        build = time.perf_counter() - start
        ids = tokenizer.encode(DOCUMENT, add_bos=False)
        masks, forced_times, advances, forced_count = [], [], [], 0
        for _ in range(5):
            matcher = GrammarMatcher(vocab, constraint)
            matcher.allowed_mask()  # the first mask builds llguidance's lazy state: not per-token work
            for token in ids:
                t0 = time.perf_counter()
                mask = matcher.allowed_mask()
                t1 = time.perf_counter()
                forced = matcher.forced_tokens()
                t2 = time.perf_counter()
                matcher.advance([token])
                t3 = time.perf_counter()
                assert mask[token]
                masks.append(t1 - t0)
                forced_times.append(t2 - t1)
                advances.append(t3 - t2)
                forced_count += bool(forced) and forced[0] == token
        us = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
        p90 = sorted(masks)[int(len(masks) * 0.9)] * 1e6
        print(
            f"| {name} | {vocab.vocab_size} | {build:.2f} | {len(ids)} | {us(masks):.0f} | {p90:.0f} | "
            f"{us(forced_times):.0f} | {us(advances):.0f} | {forced_count // 5} |"
        )


if __name__ == "__main__":
    main()
