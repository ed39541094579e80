"""`speclm generate`: complete one prompt, streaming text to the terminal (or printing JSON)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from speclm.cli.common import (
    add_eviction_args,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    eviction_options,
    load_llm,
    sampling_params,
    stats_line,
)
from speclm.config import CacheConfig


def register(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Generate a continuation of --prompt (or of a chat turn with --chat). Text streams to "
        "stdout and a statistics line goes to stderr; --json prints one JSON object instead.",
    )
    p.add_argument(
        "--prompt", "-p", default=None, help='the prompt; "" starts from BOS alone; omitted: read it from stdin'
    )
    p.add_argument("--chat", action="store_true", help="treat the prompt as a user message and apply the chat template")
    p.add_argument(
        "--json", action="store_true", help='print {"text", "token_ids", "finish_reason", "stats"} as one JSON object'
    )
    p.add_argument(
        "--compare-ar",
        action="store_true",
        help="with --spec and greedy decoding: first decode the prompt plainly (no speculation), then print both "
        "speeds, the speedup, and whether the texts are equal (they must be: exit status 1 if not)",
    )
    add_model_args(p)
    add_sampling_args(p)
    add_spec_args(p)
    add_eviction_args(p.add_argument_group("KV eviction"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # validate before the slow model load
    CacheConfig(**eviction_options(args))
    if args.prompt is None and sys.stdin.isatty():
        print("speclm generate: type the prompt, then Ctrl-D on a line of its own (or pass --prompt)", file=sys.stderr)
    if args.compare_ar and (args.spec is None or not params.greedy):
        raise ValueError("--compare-ar compares speculative with plain greedy decoding: needs --spec, temperature 0")
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    llm = load_llm(args)
    prompt_ids = llm.tokenizer.encode_chat([{"role": "user", "content": prompt}]) if args.chat else llm.encode(prompt)
    plain = plain_run(llm, prompt_ids, params) if args.compare_ar else None
    chunks = llm.stream(prompt_ids, params)
    output = None
    for chunk in chunks:
        if not args.json and chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        output = chunk.output or output
    if args.json:
        print(json.dumps(output.to_dict()))
    else:
        sys.stdout.write("\n")
        print(stats_line(output.stats, llm.spec.label if llm.spec else None), file=sys.stderr)
    if plain is not None:
        return compare_line(plain, output, llm.spec.label)
    return 0


def plain_run(llm, prompt_ids: list[int], params):
    """The prompt decoded without speculation (both engines warmed up first: lazy first-call costs stay out)."""
    plain = llm.with_spec(None)
    warm = dataclasses.replace(params, max_tokens=4)
    for engine in (plain, llm):
        engine.generate(prompt_ids[:8], warm)
    return plain.generate(prompt_ids, params)[0]


def compare_line(plain, output, label: str) -> int:
    """Print both runs' speeds and whether their texts agree; 1 if they do not."""
    same = plain.token_ids == output.token_ids
    a, s = plain.stats, output.stats
    print(
        f"[plain decoding {a.tokens_per_s:.1f} tokens/s, {label} {s.tokens_per_s:.1f} tokens/s: "
        f"{s.tokens_per_s / a.tokens_per_s:.2f}x faster, measured in this run; "
        f"{'the same text, token for token' if same else 'THE TEXTS DIFFER'}]",
        file=sys.stderr,
    )
    return 0 if same else 1
