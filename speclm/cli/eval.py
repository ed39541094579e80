"""`speclm eval ppl`: perplexity of a model on a text file over non-overlapping windows."""

from __future__ import annotations

import argparse
import json

import torch


def add_text_args(p: argparse.ArgumentParser, prefix: str = "", required: bool = True) -> None:
    """--text FILE with Spec-Bench category filters (e.g. evaluate on summarization articles)."""
    p.add_argument(
        f"--{prefix}text",
        required=required,
        metavar="FILE",
        help="a plain text file, or a Spec-Bench .jsonl (all turns of the selected rows)",
    )
    p.add_argument(
        f"--{prefix}categories", default=None, metavar="A,B", help="for .jsonl: only these categories (comma-separated)"
    )
    p.add_argument(
        f"--{prefix}exclude-categories",
        default=None,
        metavar="A,B",
        help="for .jsonl: skip these categories (comma-separated)",
    )


def split_list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model (perplexity)", description="Evaluate a model.")
    evals = p.add_subparsers(dest="eval_command", metavar="EVAL")
    ppl = evals.add_parser(
        "ppl",
        help="perplexity over non-overlapping windows",
        description="Tokenize the text once, cut it into --seq-len windows (dropping the remainder), run each "
        "window from an empty cache, and report exp(mean next-token NLL), as the GPTQ/SparseGPT papers do.",
    )
    ppl.add_argument("--model", "-m", default=None, help="model path (default: SmolLM2-135M-Instruct)")
    ppl.add_argument("--tokenizer", default=None, help="tokenizer file when the model has none inside")
    add_text_args(ppl)
    ppl.add_argument("--seq-len", type=int, default=512, help="window length in tokens (default 512)")
    ppl.add_argument("--max-windows", type=int, default=None, help="evaluate only the first N windows")
    ppl.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ppl.add_argument("--json", action="store_true", help='print {"perplexity", "tokens", "windows", "seq_len"}')
    ppl.set_defaults(run=run_ppl)
    p.set_defaults(run=lambda args: p.print_help() or 2)


def run_ppl(args: argparse.Namespace) -> int:
    from speclm.compress.data import eval_windows, read_texts, tokenize_stream
    from speclm.compress.model_io import load_with_tokenizer, rebuild
    from speclm.compress.ppl import perplexity

    if args.max_windows is not None and args.max_windows < 1:
        raise ValueError(f"--max-windows must be positive, got {args.max_windows}")
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = read_texts(args.text, split_list(args.categories), split_list(args.exclude_categories))
    checkpoint, tokenizer = load_with_tokenizer(args.model, args.tokenizer)
    windows = eval_windows(tokenize_stream(tokenizer, texts), args.seq_len)[: args.max_windows]
    model = rebuild(checkpoint)
    act_bits = (checkpoint.metadata.get("hf_config", {}).get("quantization_config") or {}).get("act_bits")
    if act_bits:  # W8A8 checkpoints: simulate the activation quantization their scheme assumes
        from speclm.compress.smoothquant import apply_activation_quant

        apply_activation_quant(model, act_bits)
    result = perplexity(model, windows, progress=not args.json)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(
            f"perplexity {result.perplexity:.4f} over {result.tokens} tokens "
            f"({result.windows} windows of {result.seq_len})"
        )
    return 0
