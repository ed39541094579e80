"""The deployment (`speclm deploy`: draft, target and coordinator as Ray Serve services) against the in-process
engine on the same pair: tokens/s at each concurrency, the per-step cost of the network hops, and what a
faster link or a GPU target would change (computed from the measured per-step costs).

    python benchmarks/deploy_bench/deploy_bench.py --model T.gguf --draft D.gguf [--prompts 4 --max-tokens 64 ...]

Greedy, fixed K, ignore_eos (every request generates max_tokens): the draft's proposals and so the target's
steps are the same in both runs, so their time difference per step is the deployment's overhead."""

from __future__ import annotations

import argparse
import gc
import shlex
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from speclm.bench.machine import machine_info
from speclm.bench.report import output_paths, write_json
from speclm.data import CODING_PROMPTS, load_prompts
from speclm.sampling_params import SamplingParams

# Assumptions of the projections (stated in the report next to them).
FAST_LINK_HOP_S = 0.0002  # a lean RPC stack's round trip of a small message (vs Ray Serve's handle path)
LINK_RTTS_MS = (0.05, 0.5, 2.0)  # loopback, same rack, across zones: added to each step's draft round trip
GPU_TARGET_STEP_S = 0.010  # a 1.5B target's verification pass of 5 rows on a datacenter GPU
GPU_DRAFT_TOKEN_S = 0.003  # one 0.5B draft token on a datacenter GPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/deploy_bench/deploy_bench.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", required=True, help="the target model")
    p.add_argument("--draft", required=True, help="the draft model")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--prompts", type=int, default=4, help="coding prompts (chat template), default 4")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,8", help="comma-separated concurrencies (default 1,8)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step (fixed; default 4)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every process (default 2)")
    p.add_argument("--out", default="benchmarks/deploy_bench")
    p.add_argument("--name", default="deploy_bench")
    p.add_argument("--note", default="", help="a line for the report (e.g. that the machine was shared)")
    return p.parse_args(argv)


def workload(texts: list[str], concurrency: int) -> list[int]:
    """Prompt indices of the requests at one concurrency: each prompt once, at least `concurrency` requests."""
    return [i % len(texts) for i in range(max(len(texts), concurrency))]


def run_in_process(args, prompts: list[list[int]], levels: list[int]) -> dict:
    """The engine in this process with the draft in this process (what `speclm serve --spec draft:D` runs)."""
    from speclm.llm import LLM

    llm = LLM(args.model, tokenizer=args.tokenizer, spec=f"draft:{args.draft}", num_speculative_tokens=args.k,
              adaptive=False, threads=args.threads)  # fmt: skip
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[0], SamplingParams(max_tokens=4))  # warm-up
    out = {}
    for c in levels:
        order = workload(prompts, c)
        t0, results = time.perf_counter(), []
        for start in range(0, len(order), c):
            results += llm.generate([prompts[i] for i in order[start : start + c]], params)
        wall = time.perf_counter() - t0
        stats = [r.stats for r in results]
        out[c] = {
            "wall_s": wall,
            "tokens": sum(s.completion_tokens for s in stats),
            "steps": sum(s.decode_steps for s in stats),
            "target_s": sum(s.target_seconds for s in stats),
            "proposer_s": sum(s.proposer_seconds for s in stats),
            "tau": sum(s.decode_tokens for s in stats) / max(1, sum(s.decode_steps for s in stats)),
            "texts": [r.text for r in results],
        }
    del llm
    gc.collect()
    return out


def run_deployment(args, prompts: list[list[int]], levels: list[int]) -> dict:
    """The same requests through the coordinator's HTTP API of a local deployment (one replica each)."""
    import httpx

    from speclm.deploy import launch
    from speclm.deploy.config import DeployConfig
    from speclm.server.config import ServerConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = DeployConfig(model=args.model, draft=args.draft, tokenizer=args.tokenizer, threads=args.threads,
                          max_draft_tokens=args.k, adaptive=False, server=ServerConfig(model_name="bench"))  # fmt: skip
    launch.init_local_ray(log_to_driver=False)
    try:
        launch.start(config, "127.0.0.1", port)
        url, stats = f"http://127.0.0.1:{port}/v1/completions", launch.target_handle().call_stats

        def complete(ids: list[int], max_tokens: int = args.max_tokens) -> str:
            body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            response = httpx.post(url, json=body, timeout=1800)
            response.raise_for_status()
            return response.json()["choices"][0]["text"]

        complete(prompts[0], 4)  # warm-up
        out = {}
        for c in levels:
            order = workload(prompts, c)
            before = stats.remote().result()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                texts = list(pool.map(lambda i: complete(prompts[i]), order))
            wall = time.perf_counter() - t0
            after = stats.remote().result()
            calls = after["calls"] - before["calls"]
            out[c] = {
                "wall_s": wall,
                "tokens": len(order) * args.max_tokens,
                "draft_calls": calls,
                "draft_call_s": after["call_seconds"] - before["call_seconds"],
                "draft_model_s": after["model_seconds"] - before["model_seconds"],
                "draft_failures": after["failures"] - before["failures"],
                "target_s": after["target_seconds"] - before["target_seconds"],
                "proposer_s": after["proposer_seconds"] - before["proposer_seconds"],
                "steps": after["decode_steps"] - before["decode_steps"],
                "texts": texts,
            }
    finally:
        launch.stop()
    return out


def summarize(args, inproc: dict, deployed: dict) -> dict:
    rows = {}
    for c, a in inproc.items():
        d = deployed[c]
        steps = a["steps"]
        hop = (d["draft_call_s"] - d["draft_model_s"]) / max(1, d["draft_calls"])
        row = {
            "in_process_tokens_per_s": a["tokens"] / a["wall_s"],
            "deployment_tokens_per_s": d["tokens"] / d["wall_s"],
            "target_steps": steps,
            "tau": a["tau"],
            "draft_calls": d["draft_calls"],
            "draft_failures": d["draft_failures"],
            "greedy_mismatches": sum(x != y for x, y in zip(a["texts"], d["texts"])),
            "in_process_ms_per_step": 1000 * a["wall_s"] / steps,
            "deployment_ms_per_step": 1000 * d["wall_s"] / steps,
            "overhead_ms_per_step": 1000 * (d["wall_s"] - a["wall_s"]) / steps,
            "draft_hop_ms_per_call": 1000 * hop,
            "draft_model_ms_per_call": 1000 * d["draft_model_s"] / max(1, d["draft_calls"]),
            "target_ms_per_step": 1000 * a["target_s"] / steps,
            "proposer_ms_per_step": 1000 * a["proposer_s"] / steps,
            "deployment_target_ms_per_step": 1000 * d["target_s"] / max(1, d["steps"]),
            "deployment_proposer_ms_per_step": 1000 * d["proposer_s"] / max(1, d["steps"]),
            "deployment_steps": d["steps"],
        }
        # What is left of a deployment step besides the target's forward and the draft call as the engine
        # waited on it: the coordinator, HTTP, the target's output stream, the engine's own bookkeeping.
        row["deployment_rest_ms_per_step"] = (
            row["deployment_ms_per_step"]
            - row["deployment_target_ms_per_step"]
            - row["deployment_proposer_ms_per_step"]
        )
        rows[c] = row
    # Projections from the concurrency-1 costs, where a step serves one sequence. A step is target forward +
    # draft call + the engine's own time (sampling, verification, bookkeeping: "rest", in both runs); what
    # only the deployment pays is the draft call's hop plus any rest beyond the in-process engine's. The
    # target's output stream to the coordinator is off the critical path (the engine does not wait for it).
    one = rows[min(rows)]
    target, draft, hop = (
        one["deployment_target_ms_per_step"],
        one["draft_model_ms_per_call"],
        one["draft_hop_ms_per_call"],
    )
    rest = max(one["deployment_ms_per_step"] - target - draft - hop, 0.0)
    engine_rest = max(one["in_process_ms_per_step"] - one["target_ms_per_step"] - one["proposer_ms_per_step"], 0.0)
    split = hop + max(rest - engine_rest, 0.0)  # the deployment's own per-step cost
    tokens_per_step = one["tau"]

    def tok_s(step_ms: float) -> float:
        return 1000 * tokens_per_step / step_ms

    step = target + draft + hop + rest
    gpu, gpu_draft, lean = 1000 * GPU_TARGET_STEP_S, 1000 * GPU_DRAFT_TOKEN_S * args.k, 1000 * FAST_LINK_HOP_S
    projections = {
        "tokens_per_step": tokens_per_step,
        "step_ms": {"target": target, "draft_model": draft, "draft_hop": hop, "rest": rest},
        "in_process_rest_ms": engine_rest,
        "split_ms": split,
        "split_share_of_cpu_step": split / step,
        "link_rtt_tokens_per_s": {str(ms): tok_s(step + ms) for ms in LINK_RTTS_MS},
        "lean_hop_tokens_per_s": tok_s(step - hop + lean),
        # On GPUs the engine's own time is left out of both sides (the same code runs in both).
        "gpu_target_in_process_tokens_per_s": tok_s(gpu + draft),
        "gpu_target_tokens_per_s": tok_s(gpu + draft + split),
        "gpu_both_in_process_tokens_per_s": tok_s(gpu + gpu_draft),
        "gpu_both_deployment_tokens_per_s": tok_s(gpu + gpu_draft + split),
        "gpu_both_lean_hop_tokens_per_s": tok_s(gpu + gpu_draft + lean),
        "split_share_of_gpu_both_step": split / (gpu + gpu_draft + split),
    }
    return {"rows": rows, "projections": projections}


def markdown(args, summary: dict, command: str, machine: dict) -> str:
    rows, p = summary["rows"], summary["projections"]
    lines = [
        "# speclm deploy (Ray Serve) vs the in-process engine",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, {machine.get('memory_gb')} GiB, torch "
        f"{machine.get('torch')}; every process {args.threads} torch threads; one replica per service, all on this "
        "machine over loopback. " + (args.note or ""),
        "",
        f"Workload: {args.prompts} coding prompts (chat template), {args.max_tokens} new tokens each, greedy, "
        f"ignore_eos, K = {args.k} fixed. At concurrency c, max(prompts, c) requests, c at a time.",
        "",
        "| concurrency | in-process tok/s | deployment tok/s | ratio | ms/step in-process | ms/step deployment "
        "| overhead ms/step | draft hop ms/call | draft model ms/call | proposer ms/step in-process "
        "| target ms/step | tau | greedy mismatches |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, r in rows.items():
        lines.append(
            f"| {c} | {r['in_process_tokens_per_s']:.1f} | {r['deployment_tokens_per_s']:.1f} | "
            f"{r['deployment_tokens_per_s'] / r['in_process_tokens_per_s']:.2f}x | {r['in_process_ms_per_step']:.1f} | "
            f"{r['deployment_ms_per_step']:.1f} | {r['overhead_ms_per_step']:.1f} | {r['draft_hop_ms_per_call']:.2f} | "
            f"{r['draft_model_ms_per_call']:.1f} | {r['proposer_ms_per_step']:.1f} | {r['target_ms_per_step']:.1f} | "
            f"{r['tau']:.2f} | "
            f"{r['greedy_mismatches']} |"
        )
    lines += [
        "",
        "ms/step: wall time over the target's verification steps (the same steps in both runs: greedy, fixed K). "
        "Overhead: the deployment's extra wall time per step. Draft hop: a draft call's wall time seen by the "
        "target minus the draft model's time inside it (serialization, Ray routing, loopback). At concurrency > 1 "
        "steps of different sequences overlap, so per-step figures there are wall time over all steps.",
        "",
        "## What a faster link or a GPU target would change (from the concurrency-1 costs)",
        "",
        f"A concurrency-1 step of the deployment: target forward {p['step_ms']['target']:.1f} ms + draft model "
        f"{p['step_ms']['draft_model']:.1f} ms + draft hop {p['step_ms']['draft_hop']:.2f} ms + the rest "
        f"{p['step_ms']['rest']:.1f} ms (the engine's own sampling, verification and bookkeeping, the coordinator, "
        f"per-request set-up; the in-process engine's rest: {p['in_process_rest_ms']:.1f} ms); "
        f"{p['tokens_per_step']:.2f} tokens per step. What only the split pays per step: "
        f"{p['split_ms']:.2f} ms ({100 * p['split_share_of_cpu_step']:.1f}% of the step): the draft call's hop, plus "
        "any rest beyond the in-process engine's. The draft's round trip is on every step's critical path; the "
        "target's output stream to the coordinator is not (the engine does not wait for it).",
        "",
        "- A real link adds its round trip to every step: "
        + ", ".join(f"{ms} ms -> {v:.1f} tok/s" for ms, v in p["link_rtt_tokens_per_s"].items())
        + ".",
        f"- A leaner hop than Ray Serve's Python handle path ({FAST_LINK_HOP_S * 1000:.1f} ms instead of "
        f"{p['step_ms']['draft_hop']:.2f} ms): {p['lean_hop_tokens_per_s']:.1f} tok/s.",
        f"- A GPU target at {GPU_TARGET_STEP_S * 1000:.0f} ms per verification step (assumed), the draft still on "
        f"this CPU (engine time left out of both sides): in-process {p['gpu_target_in_process_tokens_per_s']:.1f} "
        f"tok/s, split {p['gpu_target_tokens_per_s']:.1f} tok/s. The draft's CPU time decides the speed.",
        f"- Both models on GPUs ({GPU_TARGET_STEP_S * 1000:.0f} ms per verification, "
        f"{GPU_DRAFT_TOKEN_S * 1000:.0f} ms per draft token, assumed): in-process "
        f"{p['gpu_both_in_process_tokens_per_s']:.1f} tok/s; split with this hop "
        f"{p['gpu_both_deployment_tokens_per_s']:.1f} tok/s (the hop {100 * p['split_share_of_gpu_both_step']:.0f}% "
        f"of a step); with a {FAST_LINK_HOP_S * 1000:.1f} ms hop {p['gpu_both_lean_hop_tokens_per_s']:.1f} tok/s. On "
        "GPUs the per-step hop, not the link's bandwidth, is what a split deployment pays for.",
    ]
    if any(r["overhead_ms_per_step"] < 0 for r in rows.values()):
        lines += [
            "",
            "A negative overhead means the in-process run (which ran first) met more load from other processes "
            "than the deployment did: on this shared machine the run-to-run noise is larger than the deployment's "
            "overhead, so the tok/s ratio says nothing about it. The per-step components above are measured "
            "inside the deployment's own run (the target's forward and the draft call as the engine timed them, "
            "the draft model's time inside the call) and are the figures to use.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    from speclm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model, args.tokenizer)
    texts = [p["text"] for p in load_prompts(CODING_PROMPTS)][: args.prompts]
    prompts = [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    command = "python benchmarks/deploy_bench/deploy_bench.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    inproc = run_in_process(args, prompts, levels)
    print(f"in-process: { ({c: round(r['tokens'] / r['wall_s'], 1) for c, r in inproc.items()}) } tok/s", flush=True)
    deployed = run_deployment(args, prompts, levels)
    print(f"deployment: { ({c: round(r['tokens'] / r['wall_s'], 1) for c, r in deployed.items()}) } tok/s", flush=True)
    summary = summarize(args, inproc, deployed)
    paths = output_paths(args.out, args.name)
    payload = {"command": command, "machine": machine, "args": vars(args), "summary": summary,
               "in_process": inproc, "deployment": deployed}  # fmt: skip
    write_json(paths["json"], payload)
    with open(paths["md"], "w") as f:
        f.write(markdown(args, summary, command, machine))
    print(f"wrote {paths['json']} and {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
