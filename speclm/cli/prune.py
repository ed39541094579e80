"""`speclm prune`: magnitude / Wanda / SparseGPT pruning (unstructured or N:M) into a checkpoint directory."""

from __future__ import annotations

import argparse
import json

import torch

from speclm.cli.compress_common import add_compress_args, calibration_from_args


def parse_pattern(value: str | None) -> tuple[int, int]:
    """'2:4' -> (2, 4); None -> (0, 0)."""
    if not value:
        return 0, 0
    try:
        n, m = (int(v) for v in value.split(":"))
    except ValueError as e:
        raise ValueError(f"--pattern must look like N:M (e.g. 2:4), got {value!r}") from e
    return n, m


def register(sub) -> None:
    from speclm.compress.prune import METHODS
    from speclm.compress.structured import STRUCTURED_METHODS

    p = sub.add_parser(
        "prune",
        help="prune a model's weights",
        description="Zero weights of the decoder Linear layers (embeddings, norms and the head are kept) and write "
        "a float model directory that speclm and transformers load. Prints the achieved sparsity.",
    )
    p.add_argument(
        "--method",
        required=True,
        choices=METHODS + STRUCTURED_METHODS,
        help="unstructured/N:M: magnitude (per layer), magnitude-global, wanda, sparsegpt; structured "
        "(shrinks the tensors; --sparsity is the fraction of units removed): mlp-channels, attention-heads",
    )
    p.add_argument("--sparsity", type=float, default=0.5, help="fraction of weights to zero (default 0.5)")
    p.add_argument(
        "--pattern", default=None, metavar="N:M", help="semi-structured: zero N of every M inputs (e.g. 2:4)"
    )
    add_compress_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from speclm.compress.model_io import load_with_tokenizer, model_to_tensors, rebuild
    from speclm.compress.prune import CALIBRATED, PruneOptions, prune_model
    from speclm.compress.save import save_checkpoint

    if args.method in ("mlp-channels", "attention-heads"):
        return run_structured(args)
    n, m = parse_pattern(args.pattern)
    options = PruneOptions(args.method, args.sparsity, n, m)
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint, tokenizer = load_with_tokenizer(args.model, args.tokenizer)
    windows, calib_info = calibration_from_args(args, tokenizer) if options.method in CALIBRATED else (None, {})
    model = rebuild(checkpoint)
    sparsity = prune_model(model, options, windows)
    metadata = {
        "pruning": {"method": options.method, "target": options.label, "sparsity": sparsity},
        "source": checkpoint.source,
        "calibration": calib_info,
    }
    save_checkpoint(args.out, checkpoint.config, model_to_tensors(model), tokenizer, metadata)
    print(json.dumps({"out": args.out, "method": options.label, "sparsity": round(sparsity, 6)}))
    return 0


def run_structured(args: argparse.Namespace) -> int:
    from speclm.compress.model_io import load_with_tokenizer, rebuild
    from speclm.compress.save import save_checkpoint
    from speclm.compress.structured import prune_structured

    if args.pattern:
        raise ValueError(f"--pattern does not apply to {args.method}")
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint, tokenizer = load_with_tokenizer(args.model, args.tokenizer)
    windows, calib_info = calibration_from_args(args, tokenizer)
    before = sum(t.numel() for t in checkpoint.tensors.values())
    pruned = prune_structured(checkpoint, rebuild(checkpoint), args.method, args.sparsity, windows)
    after = sum(t.numel() for t in pruned.tensors.values())
    c = pruned.config
    metadata = {
        "pruning": {
            "method": args.method,
            "fraction": args.sparsity,
            "parameters_before": before,
            "parameters_after": after,
        },
        "source": checkpoint.source,
        "calibration": calib_info,
    }
    save_checkpoint(args.out, c, pruned.tensors, tokenizer, metadata)
    print(
        json.dumps(
            {
                "out": args.out,
                "method": args.method,
                "parameters_before": before,
                "parameters_after": after,
                "intermediate_size": c.intermediate_size,
                "num_heads": c.num_heads,
                "num_kv_heads": c.num_kv_heads,
            }
        )
    )
    return 0
