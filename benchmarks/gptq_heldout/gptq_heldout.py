"""Why GPTQ can lose to RTN with little calibration data: layer reconstruction error on the
calibration tokens versus held-out tokens, for one decoder layer of a model.

    python benchmarks/gptq_heldout/gptq_heldout.py [--model M] [--layer 3] [--samples 8,32]

Inputs of layer N come from the fp model (layers 0..N-1 unquantized); held-out = 4 windows of the
summarization articles, calibration = random windows of the other Spec-Bench categories.
"""

from __future__ import annotations

import argparse

import torch

from speclm.compress.calibration import LINEAR_NAMES, LayerwiseCalibration, hessian
from speclm.compress.data import calibration_windows, eval_windows, read_texts, tokenize_stream
from speclm.compress.gptq import gptq
from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.compress.rtn import QuantScheme, rtn
from speclm.data import SPECBENCH_PROMPTS


def layer_inputs(model, windows: torch.Tensor, layer_index: int) -> dict[str, torch.Tensor]:
    calib = LayerwiseCalibration(model, windows)
    for layer in model.layers[:layer_index]:
        calib.advance(layer)
    return calib.capture(model.layers[layer_index])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--text", default=SPECBENCH_PROMPTS)
    p.add_argument("--layer", type=int, default=3)
    p.add_argument("--samples", default="8,32", help="calibration window counts to compare (256 tokens each)")
    a = p.parse_args()
    checkpoint, tokenizer = load_with_tokenizer(a.model, a.tokenizer)
    model = rebuild(checkpoint)
    scheme = QuantScheme(4, 128, False)
    calib_stream = tokenize_stream(tokenizer, read_texts(a.text, exclude=["summarization"]))
    held = layer_inputs(
        model, eval_windows(tokenize_stream(tokenizer, read_texts(a.text, ["summarization"])), 256)[:4], a.layer
    )
    print(
        "| calibration | linear | calib RTN | calib GPTQ | held-out RTN | held-out GPTQ |\n"
        "|---|---|---:|---:|---:|---:|"
    )
    for n in (int(v) for v in a.samples.split(",")):
        cal = layer_inputs(model, calibration_windows(calib_stream, n, 256, 0), a.layer)
        for name in LINEAR_NAMES:
            w = model.layers[a.layer].get_submodule(name).weight.detach()
            w_rtn, w_gptq = rtn(w, scheme).dequantize(), gptq(w, hessian(cal[name]), scheme).dequantize()

            def err(x: torch.Tensor, wq: torch.Tensor) -> float:
                return (x @ (w - wq).T).pow(2).mean().item()

            print(
                f"| {n}x256 | {name} | {err(cal[name], w_rtn):.3g} | {err(cal[name], w_gptq):.3g} | "
                f"{err(held[name], w_rtn):.3g} | {err(held[name], w_gptq):.3g} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
