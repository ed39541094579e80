"""KV memory of a long sequence on Gemma-3-270M (15 sliding-window layers of window 512, 3 global ones): the
sliding-window layers in a pool of their own that keeps their window (speclm/kv/hybrid.py) against one
whole-length pool that they read through a mask (CacheConfig(sliding_window_pool=False)).

python benchmarks/swa_memory/swa_memory.py [--prompt-tokens 4000] [--max-tokens 64] [--threads 2]
    --out benchmarks/swa_memory/swa_memory

Each mode runs in a fresh process: a prompt of --prompt-tokens tokens (Spec-Bench prompts, one after the
other), then --max-tokens greedy tokens. Reported per mode: the most KV blocks held per pool (after each
step) and their bytes, the process's peak RSS (VmHWM; the pools are allocated untouched, so their pages
count once written; the anonymous resident memory the run added, which the KV pages are part of) and the
generated tokens (equal in both modes). A memory measurement: the JSON keeps
the prefill and decoding times too, but the markdown leaves them out (time them under the benchmark lock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODES = ("masked", "window_pool")


def status_mb(field: str = "VmHWM") -> float:
    """A memory field of /proc/self/status (VmHWM: peak RSS; RssAnon: anonymous resident memory), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def worker(mode: str, prompt_tokens: int, max_tokens: int, threads: int) -> dict:
    """One mode in this process: the request, stepped, with the pools' use after every step."""
    from speclm import LLM, SamplingParams
    from speclm.config import CacheConfig
    from speclm.data import SPECBENCH_PROMPTS, load_prompts
    from speclm.data.gemma import gemma_path
    from speclm.engine.request import Request
    from speclm.kv.hybrid import HybridBlockManager

    llm = LLM(gemma_path(), threads=threads, cache=CacheConfig(sliding_window_pool=mode == "window_pool"))
    text = "\n\n".join(p["text"] for p in load_prompts(SPECBENCH_PROMPTS))
    ids = llm.tokenizer.encode(text)[:prompt_tokens]
    assert len(ids) == prompt_tokens, len(ids)
    engine, runner, c = llm.engine, llm.runner, llm.model.config
    bm, bs = engine.block_manager, engine.config.block_size
    local = sum(runner.local_layers)
    if isinstance(bm, HybridBlockManager):
        pools = {
            "full": (bm.full, runner.kv_bytes_per_token(num_layers=c.num_layers - local) * bs),
            "local": (bm.local, runner.kv_bytes_per_token(num_layers=local) * bs),
        }
    else:
        pools = {"all layers": (bm, runner.kv_bytes_per_token() * bs)}
    most = dict.fromkeys(pools, 0)
    anon_loaded = status_mb("RssAnon")
    engine.add_request(Request("long", ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    tokens, t0, first = [], time.perf_counter(), None
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
        if tokens and first is None:
            first = time.perf_counter()
        for name, (pool, _) in pools.items():
            most[name] = max(most[name], pool.num_used_blocks)
    end = time.perf_counter()
    return {
        "mode": mode,
        "layers": {"local": local, "global": c.num_layers - local, "window": c.sliding_window},
        "block_size": bs,
        "prompt_tokens": len(ids),
        "tokens": tokens,
        "pools": {
            name: {"most_blocks": most[name], "block_bytes": size, "most_mb": most[name] * size / 2**20}
            for name, (_, size) in pools.items()
        },
        "kv_mb": sum(most[name] * size for name, (_, size) in pools.items()) / 2**20,
        "peak_rss_mb": status_mb(),
        "anon_after_load_mb": anon_loaded,
        "anon_end_mb": status_mb("RssAnon"),
        "prefill_s": first - t0,
        "decode_tokens_per_s": (len(tokens) - 1) / (end - first),
    }


def markdown(report: dict) -> str:
    r = {row["mode"]: row for row in report["runs"]}
    masked, pooled = r["masked"], r["window_pool"]
    layers = pooled["layers"]
    lines = [
        f"# KV memory of a {pooled['prompt_tokens']}-token prompt + {report['max_tokens']} tokens on Gemma-3-270M",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {report['machine'].get('cpu')}, {report['machine'].get('cores')} cores, {report['threads']} "
        f"threads, torch {report['machine'].get('torch')}. Model: {layers['local']} sliding-window layers (window "
        f"{layers['window']}) and {layers['global']} global ones, 1 KV head of 256, fp32 KV, blocks of "
        f"{pooled['block_size']} tokens. `masked`: one pool for every layer, the sliding-window layers read their "
        "window through a mask (`CacheConfig(sliding_window_pool=False)`); `window_pool`: those layers in a pool "
        "of their own whose blocks behind the window are freed (speclm/kv/hybrid.py). Each mode in a fresh "
        "process; the most blocks held per pool after any step.",
        "",
        "| mode | pool | most blocks held | KV MB |",
        "|---|---|---:|---:|",
    ]
    for row in (masked, pooled):
        for name, p in row["pools"].items():
            lines.append(f"| {row['mode']} | {name} | {p['most_blocks']} | {p['most_mb']:.1f} |")
    lines += [
        "",
        "| mode | KV MB | vs masked | anonymous RSS at the end - after load, MB | peak RSS MB |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in (masked, pooled):
        lines.append(
            f"| {row['mode']} | {row['kv_mb']:.1f} | {row['kv_mb'] / masked['kv_mb']:.2f}x "
            f"| {row['anon_end_mb'] - row['anon_after_load_mb']:.0f} | {row['peak_rss_mb']:.0f} |"
        )
    window_blocks = layers["window"] // pooled["block_size"]
    lines += [
        "",
        f"The local pool's most blocks per sequence: {pooled['pools']['local']['most_blocks']} (the window is "
        f"{window_blocks} blocks; the prompt's last chunk of rows adds its own). Generated tokens equal in both "
        f"modes: {'yes' if masked['tokens'] == pooled['tokens'] else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/swa_memory/swa_memory.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.prompt_tokens, args.max_tokens, args.threads)))
        return 0
    from speclm.bench.machine import machine_info
    from speclm.data.gemma import gemma_path

    if gemma_path() is None:
        raise SystemExit("Gemma-3-270M is missing: run `make gemma` first")
    runs = []
    for mode in MODES:
        command = [sys.executable, __file__, "--worker", mode, "--prompt-tokens", str(args.prompt_tokens)]
        command += ["--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    report = {
        "command": "python benchmarks/swa_memory/swa_memory.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "runs": runs,
    }
    table = markdown(report)
    print(table)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
        Path(f"{args.out}.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
