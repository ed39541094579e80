"""Run `speclm bench --compare` end to end and write its JSON and markdown report."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

import torch

from speclm.bench.compare import (
    SpeclmEngine,
    decode_profile,
    peak_rss_mb,
    perplexity,
    self_peak_rss_mb,
    summarize,
    time_engines,
    verification_cost,
)
from speclm.bench.machine import machine_info
from speclm.bench.report import output_paths, write_json
from speclm.config import DEFAULT_K
from speclm.llm import LLM

PEERS = ("llama.cpp", "transformers")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_compare(args: argparse.Namespace, prompts: list[dict]) -> dict:
    """Time every engine on the same prompts and token count; return the JSON payload."""
    from speclm.config import WeightFormat
    from speclm.models.loader import resolve_model_path

    formats = [WeightFormat.parse(f).label for f in args.formats.split(",") if f.strip()]
    peers = [p.strip() for p in (args.peers or ",".join(PEERS)).split(",") if p.strip()]
    for peer in peers:
        if peer not in PEERS:
            raise ValueError(f"unknown peer {peer!r} (supported: {', '.join(PEERS)})")
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    model_path = resolve_model_path(args.model)
    llms = {}
    for fmt in formats:
        log(f"loading speclm --weights {fmt} ...")
        llms[fmt] = LLM(model_path, tokenizer=args.tokenizer, weights=fmt, threads=threads)
    tokenizer = next(iter(llms.values())).tokenizer
    prompt_ids = [tokenizer.encode_chat([{"role": "user", "content": p["text"]}]) for p in prompts]

    engines = []
    for llm in llms.values():
        engines += [SpeclmEngine(llm, None, args.k), SpeclmEngine(llm, args.spec_method, args.k)]
    if "llama.cpp" in peers:
        from speclm.bench.peers import LlamaCppPeer

        log("loading llama.cpp (llama-cpp-python) ...")
        engines += [
            LlamaCppPeer(model_path, threads),
            LlamaCppPeer(model_path, threads, prompt_lookup=args.k or DEFAULT_K),
        ]
    if "transformers" in peers:
        from speclm.bench.peers import TransformersPeer

        log("loading transformers (fp32) ...")
        ar = TransformersPeer(model_path)
        engines += [ar, TransformersPeer(model_path, prompt_lookup=args.k or DEFAULT_K, model=ar.model)]

    records = time_engines(engines, prompt_ids, args.max_tokens, args.repeats, progress=log)
    reference = f"speclm {formats[0]} ar"
    baseline = "llama.cpp" if "llama.cpp" in peers else None
    summary = summarize(records, reference, baseline)

    log("perplexity, verification cost and profile ...")
    quality = {fmt: {"perplexity": perplexity(llm)} for fmt, llm in llms.items()}
    ref_ppl = quality[formats[0]]["perplexity"]
    for q in quality.values():
        q["perplexity_change"] = q["perplexity"] / ref_ppl - 1
    best = max(formats, key=lambda f: summary[f"speclm {f} ar"]["tokens_per_s"])
    verify = {fmt: verification_cost(llms[fmt]) for fmt in dict.fromkeys([best, formats[0]])}
    profile = decode_profile(llms[best])
    in_process_rss = self_peak_rss_mb()
    rss = {}
    if args.rss:
        del llms, engines
        for fmt in formats:
            log(f"peak RSS of a fresh speclm --weights {fmt} process ...")
            rss[f"speclm {fmt}"] = peak_rss_mb("speclm", model_path, threads, fmt)
        for peer in peers:
            log(f"peak RSS of a fresh {peer} process ...")
            rss[peer] = peak_rss_mb(peer, model_path, threads)
    command = (
        "speclm bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "speclm bench --compare"
    )
    return {
        "command": command,
        "machine": machine_info(),
        "threads": threads,
        "model": model_path,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "k": args.k,
        "spec_method": args.spec_method,
        "prompts": [
            {"id": p["id"], "category": p["category"], "prompt_tokens": len(ids)} for p, ids in zip(prompts, prompt_ids)
        ],
        "reference": reference,
        "baseline": baseline,
        "summary": summary,
        "quality": quality,
        "best_ar_format": best,
        "verification_cost": verify,
        "decode_profile": profile,
        "peak_rss_mb": rss,
        "bench_process_peak_rss_mb": in_process_rss,
        "records": records,
    }


def compare_markdown(r: dict) -> str:
    m = r["machine"]
    lines = [
        f"# speclm bench --compare: {os.path.basename(r['model'])}, greedy, {r['max_tokens']} tokens, "
        f"{r['threads']} thread(s)",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores, torch {m.get('torch')}. "
        "Absolute numbers depend on what else "
        "the machine runs (this tool does not check), so engines ran interleaved (repeat > prompt > engine) and "
        "tokens/s is the median over repeats of (all tokens / all seconds, prefill included) — "
        "compare ratios, not absolutes.",
        "",
        f"Prompts: {len(r['prompts'])} Spec-Bench prompts "
        f"({', '.join(sorted({p['category'] for p in r['prompts']}))}), "
        f"chat template, EOS ignored; {r['repeats']} repeats. Reference for agreement: `{r['reference']}` "
        "(fp32 = the dequantized GGUF).",
        "",
        "| engine | tokens/s (median) | x llama.cpp AR | first divergence from fp32 per prompt "
        "| prompts identical >= 32 tokens |",
        "|---|---:|---:|---|---:|",
    ]
    for name, s in r["summary"].items():
        ratio = f"{s['ratio_to_baseline']:.2f}x" if s.get("ratio_to_baseline") else "-"
        div = s["first_divergence"]
        same32 = sum(d >= min(32, r["max_tokens"]) for d in div)
        lines.append(
            f"| {name} | {s['tokens_per_s']:.1f} | {ratio} | {' '.join(map(str, div))} | {same32}/{len(div)} |"
        )
    lines += [
        "",
        "Perplexity on a fixed text (speclm formats; change vs fp32 = dequantized GGUF):",
        "",
        "| format | perplexity | change |",
        "|---|---:|---:|",
    ]
    for fmt, q in r["quality"].items():
        lines.append(f"| {fmt} | {q['perplexity']:.3f} | {100 * q['perplexity_change']:+.2f}% |")
    lines += [
        "",
        "Verification cost: time of one target pass over K+1 tokens / a 1-token pass "
        "(fixed 128-token context, medians):",
        "",
        "| format | 1-token ms | " + " | ".join(f"K={k}" for k in range(1, 9)) + " |",
        "|---|---:|" + "---:|" * 8,
    ]
    for fmt, v in r["verification_cost"].items():
        lines.append(
            f"| {fmt} | {v['single_token_ms']:.1f} | " + " | ".join(f"{x:.2f}" for x in v["ratio"].values()) + " |"
        )
    p = r["decode_profile"]
    lines += [
        "",
        f"Where a decode step's time goes (`{r['best_ar_format']}`, torch.profiler, per token): "
        f"wall {p['wall_ms_per_token_profiled']:.1f} ms, inside aten ops {p['aten_ms_per_token']:.1f} ms "
        f"({p['aten_calls_per_token']:.0f} op calls), of which aten matmul kernels {p['matmul_ms_per_token']:.1f} ms; "
        f"in speclm's C++ kernels (cProfile, another pass) {p.get('kernel_ms_per_token', 0.0):.1f} ms. "
        "Profilers slow the step down: compare shares, not the wall time.",
        "",
        "| op | ms/token | calls/token |",
        "|---|---:|---:|",
    ]
    for op in p.get("kernels", []) + p["top_ops"]:
        lines.append(f"| {op['op']} | {op['ms_per_token']:.2f} | {op['calls_per_token']:.0f} |")
    if r["peak_rss_mb"]:
        lines += [
            "",
            "Peak RSS of a fresh process that loads the engine and generates 16 tokens:",
            "",
            "| engine | peak RSS MB |",
            "|---|---:|",
        ]
        lines += [f"| {k} | {v:.0f} |" for k, v in r["peak_rss_mb"].items()]
    return "\n".join(lines) + "\n"


def write_compare(args: argparse.Namespace, prompts: list[dict]) -> int:
    result = run_compare(args, prompts)
    paths = output_paths(args.out, args.name)
    write_json(paths["json"], result)
    text = compare_markdown(result)
    with open(paths["md"], "w") as f:
        f.write(text)
    print(text)
    log(f"wrote {paths['json']}, {paths['md']}")
    return 0
