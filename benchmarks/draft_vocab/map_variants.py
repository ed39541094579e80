"""The draft's head map with and without one of its parts, on the real pair, in one run.

`draft:`'s default head scores the 32768 lowest token ids, the tokenizer's added tokens (Qwen's <|im_start|>,
<|endoftext|>, <tool_call>, ...: a chat model writes them at the end of a turn and in tool calls) and the
context's tokens outside those (a prompt's rare identifiers). `--variant added_tokens` compares the head
with and without the added tokens, `--variant context` with and without the context's tokens. Both run in
the same process on the same prompts (speclm's default `draft:`, the hybrid with adaptive K), the two
engines alternating per prompt (the order flipping from one prompt to the next), greedy, EOS ignored as
`speclm bench serve` does; every output is checked against the other's.

    python benchmarks/draft_vocab/map_variants.py --variant context --model TARGET.gguf --draft DRAFT.gguf \
        --out benchmarks/draft_vocab --name context
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from unittest import mock

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
from speclm.llm import LLM
from speclm.sampling_params import SamplingParams

CATEGORIES = "code,coding,math_reasoning,qa,rag,summarization,translation,extraction"
VARIANTS = {"added_tokens": "added tokens", "context": "the context's tokens"}


def draft_template(engine: LLM):
    """The draft model proposer that an engine's sequences copy (`draft:`'s hybrid holds it)."""
    return engine.proposers._templates[engine.spec.label].draft


def without(variant: str, target: LLM, draft: str) -> LLM:
    """An engine whose draft head lacks the variant's part (another spec label: a proposer of its own)."""
    if variant == "added_tokens":  # the map before the added tokens joined it
        with mock.patch("speclm.speculative.factory.added_token_ids", lambda path: []):
            return target.with_spec(f"draft:{draft},vocab=32768")
    engine = target.with_spec(f"draft:{draft},vocab=32768")
    draft_template(engine).head.in_map = None  # its copies never add the context's columns
    return engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=sorted(VARIANTS), default="added_tokens")
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--categories", default=CATEGORIES)
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/draft_vocab")
    p.add_argument("--name", default="added_tokens")
    args = p.parse_args()
    command = "python " + " ".join(sys.argv)
    target = LLM(args.model, threads=args.threads)
    part = VARIANTS[args.variant]
    modes = (f"without {part}", f"with {part}")
    engines = dict(zip(modes, (without(args.variant, target, args.draft), target.with_spec(f"draft:{args.draft}"))))
    before = set(target.tokenizer.added_token_ids) if args.variant == "added_tokens" else None
    in_map = draft_template(engines[modes[1]]).head.in_map
    prompts = load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", args.per_category, args.categories.split(","))
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for i, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt["text"]}]
        row = {"category": prompt["category"]}
        outputs = {}
        for mode in modes if i % 2 == 0 else modes[::-1]:
            start = time.perf_counter()
            out = engines[mode].chat(messages, params)
            seconds = time.perf_counter() - start
            outputs[mode] = out.token_ids
            row[mode] = {"seconds": seconds, "tokens": len(out.token_ids), "tau": out.stats.mean_accepted_length}
        row["equal"] = outputs[modes[0]] == outputs[modes[1]]
        # the target's tokens the head without the part could not propose
        row["outside"] = sum((t in before) if before is not None else (t not in in_map) for t in outputs[modes[1]])
        rows.append(row)
        print(row, flush=True)
    payload = {"command": command, "machine": machine_info(), "variant": args.variant, "rows": rows}
    write_report(args.out, args.name, payload, report(rows, modes, part, args, command))


def report(rows: list[dict], modes: tuple[str, str], part: str, args, command: str) -> str:
    lines = [
        *header_lines(
            f"The draft's head map with and without {part}: {os.path.basename(args.draft)}", command, machine_info()
        ),
        f"{len(rows)} chat prompts ({args.per_category} per category), greedy, {args.max_tokens} tokens, EOS ignored; "
        "tokens/s over each category's requests (prefill included). Target tokens outside: how many of the target's "
        f"tokens the head without {part} could not propose.",
        "",
        "| category | target tokens outside | tokens/s without | tokens/s with | with / without | tau without "
        "| tau with | outputs equal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    groups = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    groups["**overall**"] = rows
    for name, group in groups.items():
        rate = [sum(r[m]["tokens"] for r in group) / sum(r[m]["seconds"] for r in group) for m in modes]
        tau = [sum(r[m]["tau"] for r in group) / len(group) for m in modes]
        outside = sum(r["outside"] for r in group)
        equal = "yes" if all(r["equal"] for r in group) else "NO"
        lines.append(
            f"| {name} | {outside} | {rate[0]:.1f} | {rate[1]:.1f} | {rate[1] / rate[0]:.2f}x | {tau[0]:.2f} "
            f"| {tau[1]:.2f} | {equal} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
