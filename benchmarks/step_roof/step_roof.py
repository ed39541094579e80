"""Where a speculative step's time goes on the real pair (issue 35's code target).

One process, in one run: (1) the target's pass over r new rows (r = 1..8, native layers, logits for every
row as verification computes them) after `--context` cached tokens; (2) the target's largest linear layers
alone by rows (every layer's gate_up and down, and the output head, in turn so the weights come from
memory): whether the kernels or the rest of a pass grow with the rows; (3) the pair on chat prompts (greedy,
`--max-tokens`, ignore_eos), plain and with the draft model (`lookup=off`, so tau is the draft's own, and
the default hybrid): tokens/s, tau, drafts per step, seconds per drafted token and per verification.
Decode figures count the requests' time after their first token.

    python benchmarks/step_roof/step_roof.py --target T.gguf --draft D.gguf --out benchmarks/step_roof --name NAME
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.bench.tree_cost import measure_tree_cost
from speclm.data import load_prompts


def pass_times(runner, rows: list[int], context: int, rounds: int) -> dict[int, float]:
    """Median seconds of a target pass over r new rows (r = 1 and the chains of `speclm bench tree`, which
    times the variants round-robin so drift hits them alike) after `context` cached tokens."""
    records = measure_tree_cost(runner, [r - 1 for r in rows if r > 1], context, rounds)
    return {1: records[0]["one_median_s"]} | {r["nodes"] + 1: r["chain_median_s"] for r in records}


def linear_times(model, rows: list[int], rounds: int) -> dict[str, dict[int, float]]:
    """Best seconds per call of the target's gate_up and down projections (averaged over its layers, each
    called in turn) and its output head, by rows."""
    groups = {
        "gate_up (every layer)": [layer.mlp.gate_up_proj for layer in model.layers],
        "down (every layer)": [layer.mlp.down_proj for layer in model.layers],
        "output head": [model.lm_head],
    }
    out: dict[str, dict[int, float]] = {}
    for name, modules in groups.items():
        width = modules[0].in_features
        out[name] = {}
        for r in rows:
            x = torch.randn(r, width)
            best = float("inf")
            for _ in range(rounds):
                t0 = time.perf_counter()
                for m in modules:
                    m(x)
                best = min(best, time.perf_counter() - t0)
            out[name][r] = best / len(modules)
    return out


def pair_runs(llms: dict, prompts: list[dict], max_tokens: int) -> dict[str, list[dict]]:
    """Each prompt through every mode (in turn, prompt by prompt); per request its statistics."""
    from speclm.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    for llm in llms.values():  # warm: the draft's memo of the system prompt, the kernels' first calls
        llm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(max_tokens=8, temperature=0.0))
    runs: dict[str, list[dict]] = {mode: [] for mode in llms}
    for prompt in prompts:
        category = prompt["category"]
        for mode, llm in llms.items():
            s = llm.chat([{"role": "user", "content": prompt["text"]}], params).stats
            runs[mode].append(
                {
                    "category": category,
                    "tokens": s.completion_tokens,
                    "seconds": s.seconds,
                    "prefill_seconds": s.prefill_seconds,
                    "decode_steps": s.decode_steps,
                    "decode_tokens": s.decode_tokens,
                    "drafted": s.drafted_tokens,
                    "proposer_seconds": s.proposer_seconds,
                    "target_seconds": s.target_seconds,
                }
            )
            print(f"{category} {mode}: {s.tokens_per_s:.1f} tokens/s, tau {s.mean_accepted_length:.2f}", flush=True)
    return runs


def summarize(runs: list[dict]) -> dict:
    """A mode's totals over its requests. A decode step is a target pass after prefill, with drafts or
    without (the K controller may turn drafting off for a while); its seconds are the requests' time after
    their first token over those passes, the engine's own work between passes included."""
    total = {key: sum(r[key] for r in runs) for key in runs[0] if key != "category"}
    steps = max(1, total["decode_steps"])
    decode = total["seconds"] - total["prefill_seconds"]
    return {
        "tokens_per_s": total["tokens"] / total["seconds"],
        "tau": total["decode_tokens"] / steps,
        "drafts_per_step": total["drafted"] / steps,
        "draft_token_s": total["proposer_seconds"] / total["drafted"] if total["drafted"] else None,
        "step_s": decode / steps,
        "draft_share": total["proposer_seconds"] / decode,
        "decode_tokens_per_s": total["decode_tokens"] / decode,
        "prefill_share": total["prefill_seconds"] / total["seconds"],
    }


def markdown(payload: dict, command: str) -> str:
    machine = payload["machine"]
    load = f"; 1-minute load average at the end {payload['load_average']}"
    lines = header_lines(payload["title"], command, machine, load)
    passes = payload["passes"]
    one = passes["1"]
    lines += [
        f"## A target pass by rows (context {payload['context']}, median of {payload['rounds']} interleaved rounds)",
        "",
        "| rows | ms | vs 1 row |",
        "|---:|---:|---:|",
        *(f"| {r} | {1e3 * s:.1f} | {s / one:.2f}x |" for r, s in passes.items()),
        "",
        "## The largest linear layers alone, by rows (ms per call, best of rounds)",
        "",
        "| layer | " + " | ".join(f"{r} rows" for r in payload["linear_rows"]) + " |",
        "|---|" + "---:|" * len(payload["linear_rows"]),
    ]
    for name, times in payload["linear"].items():
        lines.append(f"| {name} | " + " | ".join(f"{1e3 * times[str(r)]:.3f}" for r in payload["linear_rows"]) + " |")
    lines += [
        "",
        f"## The pair on {len(payload['prompts'])} prompts ({', '.join(sorted(set(payload['prompts'])))}), "
        f"greedy, {payload['max_tokens']} tokens, ignore_eos",
        "",
        "| mode | tokens/s | vs plain | decode tokens/s | decode vs plain | tau | drafts per step "
        "| ms per drafted token | ms per decode step | draft share of decoding | prefill share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    plain = payload["summary"]["plain"]
    for mode, s in payload["summary"].items():
        draft = "-" if s["draft_token_s"] is None else f"{1e3 * s['draft_token_s']:.1f}"
        lines.append(
            f"| {mode} | {s['tokens_per_s']:.1f} | {s['tokens_per_s'] / plain['tokens_per_s']:.2f}x | "
            f"{s['decode_tokens_per_s']:.1f} | {s['decode_tokens_per_s'] / plain['decode_tokens_per_s']:.2f}x | "
            f"{s['tau']:.2f} | {s['drafts_per_step']:.2f} | {draft} | {1e3 * s['step_s']:.1f} | "
            f"{s['draft_share']:.0%} | {s['prefill_share']:.0%} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/step_roof/step_roof.py", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--prompts", default="speclm/data/coding_prompts.jsonl,speclm/data/specbench_dev.jsonl")
    p.add_argument("--categories", default="code,coding")
    p.add_argument("--per-category", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmarks/step_roof")
    p.add_argument("--name", default="step_roof")
    args = p.parse_args(argv)

    from speclm.llm import LLM

    llm = LLM(args.target, threads=args.threads)
    rows = list(range(1, 9))
    passes = pass_times(llm.runner, rows, args.context, args.rounds)
    linear = linear_times(llm.model, rows, 5)
    prompts = load_prompts(args.prompts, args.per_category, args.categories.split(","))
    llms = {
        "plain": llm,
        "draft model (lookup=off)": llm.with_spec(f"draft:{args.draft},lookup=off"),
        "draft (default: the hybrid)": llm.with_spec(f"draft:{args.draft}"),
    }
    runs = pair_runs(llms, prompts, args.max_tokens)
    payload = {
        "title": "A speculative step's costs on the pair: "
        f"{os.path.basename(args.target)} + {os.path.basename(args.draft)}",
        "machine": machine_info(),
        "load_average": round(os.getloadavg()[0], 2),
        "context": args.context,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "prompts": [p["category"] for p in prompts],
        "passes": {str(r): s for r, s in passes.items()},
        "linear_rows": rows,
        "linear": {name: {str(r): s for r, s in t.items()} for name, t in linear.items()},
        "runs": runs,
        "summary": {mode: summarize(r) for mode, r in runs.items()},
    }
    command = "python benchmarks/step_roof/step_roof.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    write_report(args.out, args.name, payload, markdown(payload, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
