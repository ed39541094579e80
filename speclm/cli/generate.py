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
    c = p.add_argument_group("structured output (one of)")
    c.add_argument("--json-schema", metavar="FILE", default=None, help="the output is JSON valid against this schema")
    c.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    c.add_argument("--regex", default=None, help="the output matches this regular expression")
    c.add_argument(
        "--choice", action="append", default=None, metavar="STRING", help="the output is one of these (repeat)"
    )
    c.add_argument("--grammar", metavar="FILE", default=None, help="the output follows this Lark or GBNF grammar")
    add_spec_args(p)
    add_eviction_args(p.add_argument_group("KV eviction"))
    p.set_defaults(run=run)


def constraint_of(args: argparse.Namespace):
    """The Constraint the structured-output options ask for (None: free text); ConstraintError naming the option."""
    from speclm.structured.grammar import ConstraintError, compile_constraint

    asked = []
    if args.json_schema is not None:
        with open(args.json_schema) as f:
            try:
                schema = json.load(f)
            except json.JSONDecodeError as e:
                raise ConstraintError("--json-schema", f"{args.json_schema} is not JSON: {e}") from e
        asked.append(compile_constraint("json_schema", schema, "--json-schema"))
    if args.json_object:
        asked.append(compile_constraint("json_object", None, "--json-object"))
    if args.regex is not None:
        asked.append(compile_constraint("regex", args.regex, "--regex"))
    if args.choice is not None:
        asked.append(compile_constraint("choice", args.choice, "--choice"))
    if args.grammar is not None:
        with open(args.grammar) as f:
            asked.append(compile_constraint("grammar", f.read(), "--grammar"))
    if len(asked) > 1:
        raise ConstraintError("--json-schema", "give one of --json-schema, --json-object, --regex, --choice, --grammar")
    return asked[0] if asked else None


def run(args: argparse.Namespace) -> int:
    params = dataclasses.replace(sampling_params(args), constraint=constraint_of(args))  # before the slow load
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
