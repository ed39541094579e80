"""`speclm export gguf`: write any model speclm loads (a compression output too) as a llama.cpp GGUF file."""

from __future__ import annotations

import argparse

GGUF_TYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}

EPILOG = """examples:
  speclm quantize --method gptq-int4 --out out/gptq --calib-text notes.txt
  speclm export gguf --model out/gptq --out gptq-f16.gguf --type f16
  llama-cli -m gptq-f16.gguf -p "Once upon a time"

The weights are written as speclm loads them (quantized checkpoints dequantized to their grid values),
so f32 and f16 files reproduce speclm's results; q8_0 re-quantizes them with llama.cpp's 8-bit blocks."""


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="export a model to another format (GGUF for llama.cpp)",
        description="Export a model to another format.",
    )
    formats = p.add_subparsers(dest="export_command", metavar="FORMAT")
    g = formats.add_parser(
        "gguf",
        help="a GGUF file that llama.cpp loads",
        description="Write the model (GGUF, Hugging Face directory, speclm quantize/prune/merge output, or llama2.c "
        ".bin) and its tokenizer as one GGUF file in llama.cpp's layout (llama or qwen2 architecture).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--model", "-m", default=None, help="model path (default: SmolLM2-135M-Instruct)")
    g.add_argument("--tokenizer", default=None, help="tokenizer file when the model has none inside (llama2.c)")
    g.add_argument("--out", required=True, metavar="FILE.gguf", help="the GGUF file to write")
    g.add_argument(
        "--type",
        default="f16",
        type=str.lower,
        choices=list(GGUF_TYPES),
        help="tensor type of the weight matrices (norms stay f32, as in llama.cpp; default f16)",
    )
    g.set_defaults(run=run_gguf)
    p.set_defaults(run=lambda args: p.print_help() or 2)


def run_gguf(args: argparse.Namespace) -> int:
    import os

    from speclm.compress.gguf_export import export_gguf
    from speclm.compress.model_io import load_with_tokenizer

    if not args.out.endswith(".gguf"):
        raise ValueError(f"--out must name a .gguf file, got {args.out!r}")
    if os.path.isdir(args.out):
        raise IsADirectoryError(f"--out is a directory: {args.out}")
    checkpoint, tokenizer = load_with_tokenizer(args.model, args.tokenizer)
    as_f16 = export_gguf(checkpoint, tokenizer, args.out, GGUF_TYPES[args.type])
    if as_f16:
        print(
            f"{len(as_f16)} matrices have rows that are not a multiple of 32 and were written F16 "
            f"(as llama.cpp's converter does), e.g. {as_f16[0]}"
        )
    print(f"wrote {args.out} ({GGUF_TYPES[args.type]}, {os.path.getsize(args.out) / 1e6:.1f} MB)")
    return 0
