"""What the running malloc thresholds (speclm.models.load_tuning, 181a0ab) cost in memory: peak and final RSS
of a fresh process serving the real pair (`draft:`), with glibc's mmap threshold left at loading's 1 MB
(`before`: every big temporary unmapped when freed) against the running thresholds (`after`: up to 32 MB
temporaries reused from the heap, trimmed past 64 MB). Each round runs both, each in a fresh process, in
alternating order: load, then a long rag prompt (one token) and a code prompt (128 tokens).

    python benchmarks/prefill_malloc/peak_rss.py --out benchmarks/prefill_malloc
Writes peak_rss.json and .md. Needs `make pair`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from prefill_malloc import MODES, alternating_rounds  # (this folder: the script's directory is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def status_mb() -> dict:
    """VmHWM (peak RSS) and VmRSS of this process in MB, from /proc."""
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def child(mode: str) -> dict:
    from speclm import LLM, SamplingParams
    from speclm.data.pair import pair_path
    from speclm.models.load_tuning import M_MMAP_THRESHOLD, _libc

    prompts = [json.loads(line) for line in open(os.path.join(ROOT, "speclm/data/specbench_dev.jsonl"))]
    rag = [p for p in prompts if p["category"] == "rag"][2]
    code = json.loads(open(os.path.join(ROOT, "speclm/data/coding_prompts.jsonl")).readline())
    llm = LLM(pair_path("target"), spec=f"draft:{pair_path('draft')}", threads=2)
    if mode == "before":
        _libc().mallopt(M_MMAP_THRESHOLD, 1 << 20)  # what loading left set until 181a0ab
    loaded = status_mb()
    out = llm.chat([{"role": "user", "content": rag["turns"][0]}], SamplingParams(max_tokens=1, temperature=0))
    prompt_tokens = out.stats.prompt_tokens
    llm.chat([{"role": "user", "content": code["turns"][0]}], SamplingParams(max_tokens=128, temperature=0))
    done = status_mb()
    return {
        "rss_loaded_mb": loaded["VmRSS"],
        "peak_loaded_mb": loaded["VmHWM"],
        "peak_mb": done["VmHWM"],
        "rss_end_mb": done["VmRSS"],
        "rag_prompt_tokens": prompt_tokens,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=HERE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    from speclm.bench.machine import machine_info

    runs = alternating_rounds(__file__, args.rounds)
    keys = ("rss_loaded_mb", "peak_loaded_mb", "peak_mb", "rss_end_mb")
    summary = {mode: {k: statistics.median(r[k] for r in rs) for k in keys} for mode, rs in runs.items()}
    machine = machine_info()
    command = "python benchmarks/prefill_malloc/peak_rss.py --out benchmarks/prefill_malloc" + (
        f" --rounds {args.rounds}" if args.rounds != 3 else ""
    )
    with open(os.path.join(args.out, "peak_rss.json"), "w") as f:
        json.dump({"command": command, "machine": machine, "runs": runs, "summary": summary}, f, indent=1)
    b, a = summary["before"], summary["after"]
    lines = [
        "# Memory of a `draft:` process with loading's 1 MB mmap threshold kept (before) and with the running "
        "thresholds (after)",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        "2 threads.",
        f"Medians of {args.rounds} rounds, each mode in a fresh process, alternating: the real pair loaded "
        f"(`draft:`), then a rag prompt of {runs['after'][0]['rag_prompt_tokens']} tokens (one token generated) "
        "and a code prompt (128 tokens). MB from /proc/self/status (VmRSS, VmHWM = peak RSS).",
        "",
        "| | before (1 MB) | after | after - before |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("rss_loaded_mb", "RSS after loading"),
        ("peak_loaded_mb", "peak RSS after loading"),
        ("peak_mb", "peak RSS after the two requests"),
        ("rss_end_mb", "RSS after the two requests"),
    ):
        lines.append(f"| {label} | {b[key]:.0f} | {a[key]:.0f} | {a[key] - b[key]:+.0f} |")
    with open(os.path.join(args.out, "peak_rss.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
