"""`speclm quantize`: RTN / GPTQ / AWQ / SmoothQuant / FP8 weight quantization into a checkpoint directory."""

from __future__ import annotations

import argparse

import torch

from speclm.cli.compress_common import add_compress_args, calibration_from_args


def register(sub) -> None:
    from speclm.compress.quantize import METHODS

    p = sub.add_parser(
        "quantize",
        help="quantize a model's weights",
        description="Quantize the decoder Linear weights (embeddings, norms and the head stay fp32) and write a "
        "model directory that speclm loads; the scheme is recorded in config.json's quantization_config.",
    )
    p.add_argument(
        "--method", required=True, choices=list(METHODS), metavar="METHOD", help=f"one of {', '.join(METHODS)}"
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="input columns per scale (0 = per output channel; default: 128 for 3/4-bit, 0 for 8-bit)",
    )
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--sym", dest="sym", action="store_true", default=None, help="symmetric grid (zero point fixed)")
    sym.add_argument("--asym", dest="sym", action="store_false", help="asymmetric grid (min/max)")
    p.add_argument(
        "--act-order",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GPTQ: quantize columns by descending Hessian diagonal, group params fixed up front (static "
        "groups, so stored groups stay contiguous). Default on: without it GPTQ int4 lost to RTN on "
        "SmolLM2 (benchmarks/compression/compression.md)",
    )
    p.add_argument(
        "--percdamp", type=float, default=0.01, help="GPTQ: Hessian dampening, fraction of its mean diagonal"
    )
    p.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant migration strength in [0, 1] (default 0.5)")
    p.add_argument(
        "--qat-steps", type=int, default=50, help="qat-*: training windows, one AdamW step each (default 50)"
    )
    p.add_argument("--qat-lr", type=float, default=1e-4, help="qat-*: learning rate (default 1e-4)")
    p.add_argument(
        "--kv-cache-int8",
        action="store_true",
        help="also calibrate static int8 KV-cache scales per layer and KV head (needs --calib-text)",
    )
    add_compress_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from speclm.compress.model_io import load_with_tokenizer, rebuild
    from speclm.compress.quantize import QuantizeOptions, quantize_model
    from speclm.compress.save import save_checkpoint

    if not 0 <= args.alpha <= 1:
        raise ValueError(f"--alpha must be in [0, 1], got {args.alpha}")
    if not 0 < args.percdamp < 1:
        raise ValueError(f"--percdamp must be in (0, 1), got {args.percdamp}")
    options = QuantizeOptions(
        args.method,
        args.group_size,
        args.sym,
        args.act_order,
        args.percdamp,
        args.alpha,
        args.qat_steps,
        args.qat_lr,
        args.seed,
    )
    options.scheme() if options.algorithm != "fp8" else None  # validate before loading
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint, tokenizer = load_with_tokenizer(args.model, args.tokenizer)
    needs_text = options.needs_calibration or args.kv_cache_int8
    windows, calib_info = calibration_from_args(args, tokenizer) if needs_text else (None, {})
    result = quantize_model(rebuild(checkpoint), options, windows)
    if args.kv_cache_int8:
        from speclm.compress.kv_calibration import calibrate_kv_scales, kv_scale_tensors

        if windows is None:
            raise ValueError("--kv-cache-int8 needs calibration text (--calib-text)")
        result.tensors.update(kv_scale_tensors(calibrate_kv_scales(result.model, windows)))
        result.quantization_config["kv_cache"] = {
            "dtype": "int8",
            "scheme": "symmetric, static per layer and KV head (keys after RoPE)",
            "tensors": "model.layers.N.self_attn.k_scale / v_scale [kv_heads]",
        }
    metadata = {"quantization": result.quantization_config, "source": checkpoint.source, "calibration": calib_info}
    save_checkpoint(args.out, checkpoint.config, result.tensors, tokenizer, metadata, result.quantization_config)
    print(f"wrote {args.method} checkpoint to {args.out}")
    return 0
