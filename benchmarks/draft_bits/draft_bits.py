"""Would a 3-bit draft pay? Teacher-forced top-1 agreement of the real pair's 0.5B draft with the 1.5B
target's greedy continuations, with the draft's linear layers fake-quantized per 32 inputs from the file's
dequantized weights (fp32 runtime): 4 bits as GGUF Q4_0 (what `weights=q4_0`, the draft's default, runs),
a 3-bit analogue on the same rule (d = the weight of largest magnitude / -4, codes -4..3), and that 3-bit
grid with the decoder layers quantized by GPTQ instead of rounding to nearest (calibrated on the prompts
that are not measured; ~7 min more).

Agreement is the share of the target's tokens that the draft predicts from the same prefix: the chance
that a drafted token is accepted when the drafts before it were. Usage (needs `make pair`):

    python benchmarks/draft_bits/draft_bits.py --out benchmarks/draft_bits
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path

import torch

from speclm import LLM, SamplingParams
from speclm.compress.calibration import LINEAR_NAMES, LayerwiseCalibration, hessian
from speclm.compress.data import calibration_windows, tokenize_stream
from speclm.compress.gptq import gptq
from speclm.compress.rtn import QuantScheme
from speclm.data import pair
from speclm.models.attention import AttentionMetadata
from speclm.models.builder import build_model
from speclm.models.loader import load_checkpoint

DATA = Path(__file__).resolve().parents[2] / "speclm" / "data"
BITS = {"4-bit (Q4_0)": 8, "3-bit": 4, "3-bit, GPTQ layers": 4}  # name -> half the number of levels
GPTQ = "3-bit, GPTQ layers"


def signed_max_scale(groups: torch.Tensor, half_levels: int) -> torch.Tensor:
    """Q4_0's scale per row of `groups`: d = the weight of largest magnitude / -half_levels, rounded to fp16."""
    big = torch.gather(groups, 1, groups.abs().argmax(dim=1, keepdim=True)).squeeze(1)
    return (big / -half_levels).half().float()


def fake_quantize(w: torch.Tensor, half_levels: int) -> torch.Tensor:
    """w's values after Q4_0's rounding rule with 2 * half_levels levels per 32 inputs (fp16 scale)."""
    groups = w.reshape(-1, 32)
    d = signed_max_scale(groups, half_levels).unsqueeze(1)
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    codes = torch.clamp(torch.trunc(groups * inverse + half_levels + 0.5), 0, 2 * half_levels - 1) - half_levels
    return (codes * d).reshape(w.shape)


def signed_max_fit(w: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """fake_quantize's grid as GPTQ's group params (scale, zero) for the columns w [rows, cols] of a group."""
    half = 2 ** (scheme.bits - 1)
    d = signed_max_scale(w, half)
    return torch.where(d == 0, torch.full_like(d, 1e-8), d), torch.full_like(d, float(half))


def prompts(code: int, per_category: int, measured: bool = True) -> list[tuple[str, str]]:
    """The first `code` coding prompts and `per_category` Spec-Bench dev prompts per category (measured), or
    every other turn of both files (calibration text)."""
    rows = [json.loads(line) for line in (DATA / "coding_prompts.jsonl").open()]
    picked = rows[:code] if measured else rows[code:]
    seen: dict[str, int] = {}
    for line in (DATA / "specbench_dev.jsonl").open():
        row = json.loads(line)
        seen[row["category"]] = seen.get(row["category"], 0) + 1
        if (seen[row["category"]] <= per_category) == measured:
            picked.append(row)
    return [(row["category"], turn) for row in picked for turn in row["turns"][: 1 if measured else None] if turn]


@torch.no_grad()
def gptq_layers(model: torch.nn.Module, windows: torch.Tensor, half_levels: int) -> None:
    """The decoder layers' Linears quantized by GPTQ on fake_quantize's grid, one layer at a time (the next
    layer calibrated on the quantized one's outputs), per 32 inputs, columns by descending Hessian diagonal."""
    scheme = QuantScheme(half_levels.bit_length(), 32, True)
    calib = LayerwiseCalibration(model, windows)
    for _, layer in calib.layers("gptq"):
        inputs = calib.capture(layer)
        for name in LINEAR_NAMES:
            module = layer.get_submodule(name)
            quantized = gptq(module.weight, hessian(inputs[name]), scheme, act_order=True, fit=signed_max_fit)
            module.weight.copy_(quantized.dequantize())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/draft_bits")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = pair.pair_path("target"), pair.pair_path("draft")
    if target is None or draft is None:
        raise SystemExit("error: the real pair is not cached; run `make pair` first")

    llm = LLM(model=target, threads=args.threads)
    sequences = []
    for category, text in prompts(code=4, per_category=1):
        messages = [{"role": "user", "content": text}]
        out = llm.chat(messages, SamplingParams(max_tokens=args.tokens))
        sequences.append((category, llm.tokenizer.encode_chat(messages), out.token_ids))
    calibration = [text for _, text in prompts(code=4, per_category=1, measured=False)]
    windows = calibration_windows(tokenize_stream(llm.tokenizer, calibration), 64, 256, seed=0)  # same tokenizer
    del llm

    checkpoint = load_checkpoint(draft)
    results = {}
    for name, half_levels in BITS.items():
        model = build_model(checkpoint, weights="fp32")
        if name == GPTQ:
            gptq_layers(model, windows, half_levels)
        with torch.no_grad():
            for module_name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear) and (name != GPTQ or module_name == "lm_head"):
                    module.weight.copy_(fake_quantize(module.weight, half_levels))
        per_category: dict[str, list[int]] = {}
        for category, prompt, generated in sequences:
            tokens = prompt + generated
            cache = model.new_cache(len(tokens))
            with torch.no_grad():
                positions = torch.arange(len(tokens))
                hidden = model(torch.tensor(tokens), positions, cache, AttentionMetadata(0, len(tokens)))
                predicted = model.compute_logits(hidden[len(prompt) - 1 : len(tokens) - 1]).argmax(-1).tolist()
            counts = per_category.setdefault(category, [0, 0])
            counts[0] += sum(int(p == t) for p, t in zip(predicted, generated, strict=True))
            counts[1] += len(generated)
        results[name] = {c: a / n for c, (a, n) in per_category.items()}
        matched = sum(a for a, _ in per_category.values())
        results[name]["overall"] = matched / sum(n for _, n in per_category.values())
        print(name, {c: round(v, 3) for c, v in results[name].items()}, flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    record = {
        "command": "python benchmarks/draft_bits/draft_bits.py --out " + args.out,
        "commit": commit,
        "machine": machine,
        "tokens": args.tokens,
        "agreement": results,
    }
    (out / "draft_bits.json").write_text(json.dumps(record, indent=1) + "\n")
    categories = list(next(iter(results.values())))
    lines = ["| draft weights | " + " | ".join(categories) + " |", "|---" + "|---:" * len(categories) + "|"]
    for name, row in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.3f}" for c in categories) + " |")
    (out / "draft_bits_table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
