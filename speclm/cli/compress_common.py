"""Options shared by the offline compression commands (quantize, prune): model, output, calibration."""

from __future__ import annotations

import argparse

import torch

from speclm.cli.eval import add_text_args, split_list


def add_compress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, help="model path (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tokenizer", default=None, help="tokenizer file when the model has none inside")
    p.add_argument("--out", required=True, help="output directory (config.json, model.safetensors, tokenizer)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    g = p.add_argument_group("calibration (GPTQ, AWQ, SmoothQuant, Wanda, SparseGPT)")
    add_text_args(g, prefix="calib-", required=False)
    g.add_argument("--calib-samples", type=int, default=32, help="random windows sampled from the text (default 32)")
    g.add_argument("--calib-seq-len", type=int, default=512, help="tokens per calibration window (default 512)")
    g.add_argument("--seed", type=int, default=0, help="seed of the calibration sampling (default 0)")


def calibration_from_args(args: argparse.Namespace, tokenizer) -> tuple[torch.Tensor | None, dict]:
    """Calibration windows [samples, seq_len] (None without --calib-text) and their description."""
    from speclm.compress.data import calibration_windows, read_texts, tokenize_stream

    if args.calib_text is None:
        if args.calib_categories or args.calib_exclude_categories:
            raise ValueError("--calib-categories/--calib-exclude-categories need --calib-text")
        return None, {}
    texts = read_texts(args.calib_text, split_list(args.calib_categories), split_list(args.calib_exclude_categories))
    windows = calibration_windows(tokenize_stream(tokenizer, texts), args.calib_samples, args.calib_seq_len, args.seed)
    info = {
        "text": args.calib_text,
        "categories": args.calib_categories,
        "exclude_categories": args.calib_exclude_categories,
        "samples": args.calib_samples,
        "seq_len": args.calib_seq_len,
        "seed": args.seed,
    }
    return windows, info
