"""The draft's output-head map (`draft:PATH,vocab=N`: the N lowest token ids) against the target's own tokens.

The target answers each prompt greedily; the draft model reads prompt + answer in one pass. For each N it
reports the draft's agreement (its argmax, over the map, equal to the target's next token) and how many of
the target's tokens lie outside the map, and of those, how many appeared earlier in the same context
(prompt or answer so far): what a map that adds the context's own tokens would win back.

    python benchmarks/draft_vocab/coverage.py --model TARGET.gguf --draft DRAFT.gguf --out benchmarks/draft_vocab
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
from speclm.llm import LLM
from speclm.models.attention import AttentionMetadata
from speclm.sampling_params import SamplingParams

SIZES = [32768, 65536, 100000, 0]  # 0: the whole vocabulary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--categories", default="code,coding,math_reasoning,qa")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/draft_vocab")
    p.add_argument("--name", default="coverage")
    args = p.parse_args()
    target = LLM(args.model, threads=args.threads)
    draft = LLM(args.draft, threads=args.threads, weights="q4_0").model  # the draft's default runtime format
    end_of_turn = min(target.tokenizer.eos_token_ids)  # Qwen2: the special tokens follow the BPE vocabulary
    texts = [
        q["text"]
        for q in load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", args.per_category, args.categories.split(","))
    ]
    rows = {n: {"agree": 0, "outside": 0, "outside_in_context": 0} for n in SIZES}
    total = 0
    for text in texts:
        messages = [{"role": "user", "content": text}]
        answer = target.chat(messages, SamplingParams(max_tokens=args.max_tokens)).token_ids
        prompt = target.tokenizer.encode_chat(messages)
        tokens = prompt + answer
        with torch.no_grad():
            hidden = draft(
                torch.tensor(tokens),
                torch.arange(len(tokens)),
                draft.new_cache(len(tokens)),
                AttentionMetadata(0, len(tokens)),
            )
            logits = draft.compute_logits(hidden[len(prompt) - 1 : len(tokens) - 1]).float()
        total += len(answer)
        for n in SIZES:
            masked = logits.clone()
            if n:
                masked[:, n:end_of_turn] = float("-inf")
            r = rows[n]
            r["agree"] += int((masked.argmax(-1) == torch.tensor(answer)).sum())
            for i, t in enumerate(answer):
                if n and n <= t < end_of_turn:
                    r["outside"] += 1
                    r["outside_in_context"] += int(t in tokens[: len(prompt) + i])
    lines = [
        *header_lines(
            f"The draft's head map against the target's tokens: {os.path.basename(args.draft)}",
            "python " + " ".join(sys.argv),
            machine_info(),
        ),
        f"{len(texts)} prompts ({args.categories}, {args.per_category} each), the target's greedy answers "
        f"({total} tokens, up to {args.max_tokens} each).",
        "",
        "| map (lowest ids) | draft agrees with the target | target tokens outside the map "
        "| of those, seen earlier in the context |",
        "|---|---:|---:|---:|",
    ]
    for n, r in rows.items():
        lines.append(
            f"| {n or 'whole vocabulary'} | {r['agree'] / total:.3f} | {r['outside']} ({r['outside'] / total:.1%}) "
            f"| {r['outside_in_context']} |"
        )
    write_report(
        args.out,
        args.name,
        {
            "command": "python " + " ".join(sys.argv),
            "machine": machine_info(),
            "tokens": total,
            "rows": {str(n): r for n, r in rows.items()},
        },
        "\n".join(lines) + "\n",
    )


if __name__ == "__main__":
    main()
