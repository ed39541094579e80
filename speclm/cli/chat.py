"""`speclm chat`: an interactive conversation using the model's chat template."""

from __future__ import annotations

import argparse
import sys

from speclm.cli.common import (
    add_eviction_args,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    load_llm,
    sampling_params,
    stats_line,
)


def register(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="chat interactively",
        description="Chat with the model. Type a message and press Enter; /reset clears the history, "
        "/exit (or Ctrl-D) quits. Answers stream as they are generated.",
    )
    p.add_argument("--system", default=None, help="a system message to start the conversation with")
    p.add_argument("--stats", action="store_true", help="print a statistics line after each answer")
    add_model_args(p)
    add_sampling_args(p, max_tokens=512)
    add_spec_args(p)
    add_eviction_args(
        p.add_argument_group("KV eviction (each answer's sequence: the conversation so far, then the answer)")
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(start)
            continue
        messages.append({"role": "user", "content": text})
        if interactive:
            print("assistant> ", end="", flush=True)
        output = None
        for chunk in llm.stream_chat(messages, params):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            output = chunk.output or output
        print()
        messages.append({"role": "assistant", "content": output.text})
        if args.stats:
            print(stats_line(output.stats, llm.spec.label if llm.spec else None), file=sys.stderr)
    return 0
