"""Compression benchmark: perplexity of one model under each quantization / pruning method.

    python benchmarks/compression/compression.py --model M [--tokenizer T] --label NAME \
        --json benchmarks/compression/compression_NAME.json

Runs the same library calls as `speclm quantize` / `speclm prune` followed by `speclm eval ppl`, in
one process (the model is loaded and the text tokenized once); results are appended to the JSON
after every configuration so a long run keeps what it finished. `--markdown` renders the table.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from speclm.bench.machine import machine_info
from speclm.compress.data import calibration_windows, eval_windows, read_texts, tokenize_stream
from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.compress.ppl import perplexity
from speclm.compress.prune import PruneOptions, prune_model
from speclm.compress.quantize import QuantizeOptions, quantize_model
from speclm.compress.smoothquant import apply_activation_quant
from speclm.data import SPECBENCH_PROMPTS

EVAL_CATEGORIES = ["summarization"]  # evaluate on the articles; calibrate on every other category
CONFIGS = [  # (label, kind, method, extra), in priority order: a run cut short keeps the key comparisons
    ("fp32", "none", None, {}),
    ("RTN int4 (g128)", "quantize", "rtn-int4", {}),
    ("GPTQ int4 (g128)", "quantize", "gptq-int4", {}),
    ("GPTQ int4 (g128) without act-order", "quantize", "gptq-int4", {"act_order": False}),
    ("AWQ int4 (g128)", "quantize", "awq-int4", {}),
    ("magnitude 50%", "prune", "magnitude", {"sparsity": 0.5}),
    ("Wanda 50%", "prune", "wanda", {"sparsity": 0.5}),
    ("SparseGPT 50%", "prune", "sparsegpt", {"sparsity": 0.5}),
    ("RTN int8 (per channel)", "quantize", "rtn-int8", {}),
    ("SmoothQuant W8A8", "quantize", "smoothquant-w8a8", {}),
    ("magnitude 2:4", "prune", "magnitude", {"pattern": "2:4"}),
    ("Wanda 2:4", "prune", "wanda", {"pattern": "2:4"}),
    ("SparseGPT 2:4", "prune", "sparsegpt", {"pattern": "2:4"}),
    ("FP8 E4M3 (per channel)", "quantize", "fp8-e4m3", {}),
    ("FP8 E5M2 (per channel)", "quantize", "fp8-e5m2", {}),
    ("RTN int3 (g128)", "quantize", "rtn-int3", {}),
    ("GPTQ int3 (g128)", "quantize", "gptq-int3", {}),
    ("AWQ int3 (g128)", "quantize", "awq-int3", {}),
]


def cli_command(kind: str, method: str | None, extra: dict, a: argparse.Namespace) -> str:
    """The equivalent `speclm` commands for one configuration (compress to DIR, then evaluate)."""
    model = (f"--model {a.model} " if a.model else "") + (f"--tokenizer {a.tokenizer} " if a.tokenizer else "")
    ev = (
        f"speclm eval ppl --model {{}} --text {a.text} --categories {','.join(EVAL_CATEGORIES)} "
        f"--seq-len {a.seq_len}" + (f" --max-windows {a.eval_windows}" if a.eval_windows else "")
    )
    if kind == "none":
        cmd = ev.format(a.model) if a.model else ev.replace("--model {} ", "")
        return cmd + (f" --tokenizer {a.tokenizer}" if a.tokenizer else "")
    calib = (
        f" --calib-text {a.text} --calib-exclude-categories {','.join(EVAL_CATEGORIES)} "
        f"--calib-samples {a.calib_samples} --calib-seq-len {a.calib_seq_len} --seed {a.seed}"
    )
    if kind == "quantize":
        needs = QuantizeOptions(method).needs_calibration
        cmd = f"speclm quantize {model}--method {method} --out DIR" + (calib if needs else "")
        cmd += " --no-act-order" if extra.get("act_order") is False else ""
    else:
        opt = f"--pattern {extra['pattern']}" if "pattern" in extra else f"--sparsity {extra['sparsity']}"
        cmd = f"speclm prune {model}--method {method} {opt} --out DIR" + (
            calib if method in ("wanda", "sparsegpt") else ""
        )
    return f"{cmd} && {ev.format('DIR')}"


def run(a: argparse.Namespace) -> None:
    torch.manual_seed(0)
    checkpoint, tokenizer = load_with_tokenizer(a.model, a.tokenizer)
    eval_stream = tokenize_stream(tokenizer, read_texts(a.text, EVAL_CATEGORIES))
    windows = eval_windows(eval_stream, a.seq_len)[: a.eval_windows or None]  # 0: every window
    calib_stream = tokenize_stream(tokenizer, read_texts(a.text, exclude=EVAL_CATEGORIES))
    calib = calibration_windows(calib_stream, a.calib_samples, a.calib_seq_len, a.seed)
    report = {
        "model": a.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to fp32)",
        "label": a.label,
        "machine": machine_info(),
        "eval": {
            "text": a.text,
            "categories": EVAL_CATEGORIES,
            "seq_len": a.seq_len,
            "windows": int(windows.shape[0]),
            "tokens": int(windows.shape[0] * (a.seq_len - 1)),
        },
        "calibration": {
            "exclude_categories": EVAL_CATEGORIES,
            "samples": a.calib_samples,
            "seq_len": a.calib_seq_len,
            "seed": a.seed,
        },
        "results": [],
    }
    only = set(a.only.split(",")) if a.only else None
    if a.update:  # re-run some rows of an existing report: same eval and calibration, other rows kept
        with open(a.json) as f:
            old = json.load(f)
        if (old["eval"], old["calibration"]) != (report["eval"], report["calibration"]):
            raise SystemExit(f"--update: {a.json} was made with another eval/calibration setup; rows would not compare")
        report["results"] = [row for row in old["results"] if not only or row["config"] not in only]
    order = [c[0] for c in CONFIGS]
    for label, kind, method, extra in CONFIGS:
        if only and label not in only:
            continue
        start = time.time()
        model = rebuild(checkpoint)
        sparsity = None
        if kind == "quantize":
            options = QuantizeOptions(method, act_order=extra.get("act_order", True))
            quantize_model(model, options, calib if options.needs_calibration else None)
            if options.algorithm == "smoothquant":
                apply_activation_quant(model, 8)
        elif kind == "prune":
            n, m = (int(v) for v in extra["pattern"].split(":")) if "pattern" in extra else (0, 0)
            sparsity = prune_model(model, PruneOptions(method, extra.get("sparsity", 0.5), n, m), calib)
        result = perplexity(model, windows, progress=False)
        row = {
            "config": label,
            "perplexity": result.perplexity,
            "sparsity": sparsity,
            "seconds": round(time.time() - start, 1),
            "command": cli_command(kind, method, extra, a),
        }
        print(json.dumps(row), flush=True)
        row["window_nll"] = result.window_nll
        report["results"].append(row)
        report["results"].sort(key=lambda r: order.index(r["config"]))
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


PAIRS = [
    ("GPTQ int4 (g128)", "RTN int4 (g128)"),
    ("GPTQ int4 (g128) without act-order", "RTN int4 (g128)"),
    ("GPTQ int4 (g128)", "GPTQ int4 (g128) without act-order"),
    ("AWQ int4 (g128)", "RTN int4 (g128)"),
    ("GPTQ int3 (g128)", "RTN int3 (g128)"),
    ("AWQ int3 (g128)", "RTN int3 (g128)"),
    ("SparseGPT 50%", "Wanda 50%"),
    ("SparseGPT 2:4", "Wanda 2:4"),
]


def paired_difference(a: list[float], b: list[float], tokens_per_window: int) -> tuple[float, float]:
    """Mean per-token NLL difference a - b over the same windows, and its standard error (window-level pairs)."""
    d = (
        torch.tensor(a, dtype=torch.float64) / tokens_per_window
        - torch.tensor(b, dtype=torch.float64) / tokens_per_window
    )
    return d.mean().item(), (d.std() / len(d) ** 0.5).item() if len(d) > 1 else float("nan")


def paired_lines(r: dict) -> list[str]:
    """Is a method really better than its baseline on these windows? Paired per-window NLL differences."""
    rows = {row["config"]: row for row in r["results"] if row.get("window_nll")}
    out = []
    for a, b in PAIRS:
        if a in rows and b in rows:
            mean, se = paired_difference(rows[a]["window_nll"], rows[b]["window_nll"], r["eval"]["seq_len"] - 1)
            out.append(f"| {a} - {b} | {mean:+.4f} | {se:.4f} | {mean / se:+.1f} |")
    if not out:
        return []
    return [
        "",
        "Paired comparison over the same windows: mean per-token NLL difference (nats; negative = the first "
        "is better), its standard error across windows, and their ratio.",
        "",
        "| comparison | NLL difference | std. error | z |",
        "|---|---:|---:|---:|",
        *out,
    ]


def markdown(paths: list[str]) -> str:
    """One table per JSON report, with the setup and the exact commands."""
    lines = [
        "# Compression results: perplexity (lower is better)",
        "",
        "Generated by `python benchmarks/compression/compression.py` (commands below). "
        "Evaluation text: the `summarization` "
        "articles of the Spec-Bench prompts (`speclm/data/specbench_dev.jsonl`); "
        "calibration: random windows (seeded) from all *other* "
        "categories, so the two are disjoint. Perplexity = exp(mean NLL) over non-overlapping windows from one "
        "tokenization (remainder dropped). Only decoder Linear weights are compressed; embeddings, norms and the "
        "head stay fp32.",
        "",
    ]
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        e, c = r["eval"], r["calibration"]
        base = r["results"][0]["perplexity"] if r["results"] and r["results"][0]["config"] == "fp32" else None
        lines += [
            f"## {r['label']}",
            "",
            f"Model: {r['model']}. Eval: {e['windows']} windows x {e['seq_len']} tokens "
            f"({e['tokens']} predicted tokens). Calibration: {c['samples']} windows x {c['seq_len']} tokens, "
            f"seed {c['seed']}. "
            f"Machine: {r['machine'].get('cpu', '')} ({r['machine'].get('torch_threads', '')} torch threads).",
            "",
            "| configuration | perplexity | vs fp32 | weight sparsity |",
            "|---|---:|---:|---:|",
        ]
        for row in r["results"]:
            delta = f"{row['perplexity'] / base:.3f}x" if base else ""
            sp = f"{row['sparsity']:.1%}" if row["sparsity"] is not None else ""
            lines.append(f"| {row['config']} | {row['perplexity']:.3f} | {delta} | {sp} |")
        lines += paired_lines(r)
        lines += ["", "<details><summary>exact commands</summary>", ""]
        lines += [f"- {row['config']}: `{row['command']}`" for row in r["results"]]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--label", default="model")
    p.add_argument("--text", default=SPECBENCH_PROMPTS)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--eval-windows", type=int, default=16, help="first N evaluation windows (0 = all)")
    p.add_argument("--calib-samples", type=int, default=16)
    p.add_argument("--calib-seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="comma-separated configuration labels to run")
    p.add_argument("--json", default=None, help="write results here (JSON)")
    p.add_argument("--update", action="store_true", help="keep the other rows of an existing --json (with --only)")
    p.add_argument("--markdown", nargs="+", default=None, metavar="JSON", help="render these JSON reports as markdown")
    a = p.parse_args()
    if a.markdown:
        print(markdown(a.markdown))
        return
    if not a.json:
        p.error("--json is required when running")
    run(a)


if __name__ == "__main__":
    main()
