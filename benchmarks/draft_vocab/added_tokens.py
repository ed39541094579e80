"""The draft's head map with and without the tokenizer's added tokens, on the real pair, in one run.

`draft:`'s default map is the 32768 lowest token ids; since this change it also holds the tokenizer's added
tokens (Qwen's <|im_start|>, <|endoftext|>, <tool_call>, ...), which a chat model writes at the end of a
turn and in tool calls. Both maps run in the same process on the same prompts (speclm's default `draft:`, the
hybrid with adaptive K), the two engines alternating per prompt (the order flipping from one prompt to
the next), greedy, EOS ignored as `speclm bench serve` does; every output is checked against the other's.

    python benchmarks/draft_vocab/added_tokens.py --model TARGET.gguf --draft DRAFT.gguf --out benchmarks/draft_vocab
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
MODES = ("without added tokens", "with added tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    with mock.patch("speclm.speculative.factory.added_token_ids", lambda path: []):  # the map before this change
        before = target.with_spec(f"draft:{args.draft},vocab=32768")  # (another label: a proposer of its own)
    engines = dict(zip(MODES, (before, target.with_spec(f"draft:{args.draft}"))))
    added = target.tokenizer.added_token_ids
    prompts = load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", args.per_category, args.categories.split(","))
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for i, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt["text"]}]
        row = {"category": prompt["category"]}
        outputs = {}
        for mode in MODES if i % 2 == 0 else MODES[::-1]:
            start = time.perf_counter()
            out = engines[mode].chat(messages, params)
            seconds = time.perf_counter() - start
            outputs[mode] = out.token_ids
            row[mode] = {"seconds": seconds, "tokens": len(out.token_ids), "tau": out.stats.mean_accepted_length}
        row["equal"] = outputs[MODES[0]] == outputs[MODES[1]]
        row["added_tokens_written"] = sum(t in added for t in outputs[MODES[1]])
        rows.append(row)
        print(row, flush=True)
    write_report(
        args.out, args.name, {"command": command, "machine": machine_info(), "rows": rows}, report(rows, args, command)
    )


def report(rows: list[dict], args, command: str) -> str:
    lines = [
        *header_lines(
            f"The draft's head map with and without the added tokens: {os.path.basename(args.draft)}",
            command,
            machine_info(),
        ),
        f"{len(rows)} chat prompts ({args.per_category} per category), greedy, {args.max_tokens} tokens, EOS ignored; "
        "tokens/s over each category's requests (prefill included). Added tokens written: how many of the target's "
        "tokens were added tokens (outside the map before).",
        "",
        "| category | added tokens written | tokens/s without | tokens/s with | with / without | tau without "
        "| tau with | outputs equal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    groups = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    groups["**overall**"] = rows
    for name, group in groups.items():
        rate = [sum(r[m]["tokens"] for r in group) / sum(r[m]["seconds"] for r in group) for m in MODES]
        tau = [sum(r[m]["tau"] for r in group) / len(group) for m in MODES]
        written = sum(r["added_tokens_written"] for r in group)
        equal = "yes" if all(r["equal"] for r in group) else "NO"
        lines.append(
            f"| {name} | {written} | {rate[0]:.1f} | {rate[1]:.1f} | {rate[1] / rate[0]:.2f}x | {tau[0]:.2f} "
            f"| {tau[1]:.2f} | {equal} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
