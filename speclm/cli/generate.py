"""`speclm generate`: complete one prompt, streaming text to the terminal (or printing JSON)."""

from __future__ import annotations

import argparse
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
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    llm = load_llm(args)
    if args.chat:
        chunks = llm.stream_chat([{"role": "user", "content": prompt}], params)
    else:
        chunks = llm.stream(prompt, params)
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
    return 0
