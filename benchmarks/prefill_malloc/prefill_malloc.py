"""What loading's malloc setting cost a running model: the real pair's target with glibc's mmap threshold
left at loading's 1 MB (`before`, as up to this commit: every temporary of 1 MB or more, which a prompt
chunk makes in every layer, is a fresh mmap whose pages fault when first written) against the running
thresholds that speclm.models.load_tuning now sets after loading (`after`). Each round runs both, each in
a fresh process, in alternating order: prompt passes of long Spec-Bench prompts (rag, summarization;
one generated token), then 128 tokens of a code prompt, plain and with the 0.5B draft.

    python benchmarks/prefill_malloc/prefill_malloc.py --out benchmarks/prefill_malloc
Writes prefill_malloc.json and .md. Needs `make pair`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODES = ("before", "after")


def child(mode: str) -> dict:
    from speclm import LLM, SamplingParams
    from speclm.data.pair import pair_path
    from speclm.models.load_tuning import M_MMAP_THRESHOLD, _libc

    prompts = [json.loads(line) for line in open(os.path.join(ROOT, "speclm/data/specbench_dev.jsonl"))]
    rag = [p for p in prompts if p["category"] == "rag"]
    long = rag[2:6] + [p for p in prompts if p["category"] == "summarization"][:2]
    code = json.loads(open(os.path.join(ROOT, "speclm/data/coding_prompts.jsonl")).readline())
    result: dict = {"prefill": []}
    for spec in (None, f"draft:{pair_path('draft')}"):
        llm = LLM(pair_path("target"), spec=spec, threads=2)
        if mode == "before":
            _libc().mallopt(M_MMAP_THRESHOLD, 1 << 20)  # what loading left set until this commit
        chat = [{"role": "user", "content": "Say hi."}]
        llm.chat(chat, SamplingParams(max_tokens=8, temperature=0))  # warm-up
        if spec is None:
            for p in long:
                one = SamplingParams(max_tokens=1, temperature=0)
                out = llm.chat([{"role": "user", "content": p["turns"][0]}], one)
                result["prefill"].append({"tokens": out.stats.prompt_tokens, "seconds": out.stats.prefill_seconds})
        out = llm.chat(
            [{"role": "user", "content": code["turns"][0]}],
            SamplingParams(max_tokens=128, temperature=0, ignore_eos=True),
        )
        result["draft" if spec else "plain"] = out.stats.decode_tokens / (out.stats.seconds - out.stats.prefill_seconds)
        del llm
    return result


def alternating_rounds(script: str, rounds: int) -> dict[str, list[dict]]:
    """Each mode's results (the last stdout line of `script --child MODE`, as JSON), a fresh process per
    mode and round, the modes' order alternating by round."""
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            out = subprocess.run([sys.executable, script, "--child", mode], check=True, capture_output=True, text=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(mode, runs[mode][-1], flush=True)
    return runs


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
    summary = {}
    for mode, rs in runs.items():
        prefill = [sum(x["tokens"] for x in r["prefill"]) / sum(x["seconds"] for x in r["prefill"]) for r in rs]
        summary[mode] = {
            "prefill_tokens_per_s": statistics.median(prefill),
            "plain_decode_tokens_per_s": statistics.median(r["plain"] for r in rs),
            "draft_decode_tokens_per_s": statistics.median(r["draft"] for r in rs),
        }
    machine = machine_info()
    command = "python benchmarks/prefill_malloc/prefill_malloc.py --out benchmarks/prefill_malloc" + (
        f" --rounds {args.rounds}" if args.rounds != 3 else ""
    )
    with open(os.path.join(args.out, "prefill_malloc.json"), "w") as f:
        json.dump({"command": command, "machine": machine, "runs": runs, "summary": summary}, f, indent=1)
    b, a = summary["before"], summary["after"]
    tokens = [x["tokens"] for x in runs["after"][0]["prefill"]]
    lines = [
        "# Loading's 1 MB mmap threshold against the running thresholds (Qwen2.5-Coder-1.5B Q4_K_M, 0.5B draft)",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        "2 threads.",
        f"Medians of {args.rounds} rounds, each mode in a fresh process, alternating. Prompt passes: "
        f"{len(tokens)} Spec-Bench prompts (rag, summarization) of {min(tokens)}-{max(tokens)} tokens, "
        "prompt tokens over prefill seconds; decoding: 128 tokens of a code prompt, after its prefill.",
        "",
        "| | before (1 MB) | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("prefill_tokens_per_s", "prompt tokens/s"),
        ("plain_decode_tokens_per_s", "plain decoding tokens/s"),
        ("draft_decode_tokens_per_s", "`draft:` decoding tokens/s"),
    ):
        lines.append(f"| {label} | {b[key]:.1f} | {a[key]:.1f} | {a[key] / b[key]:.2f}x |")
    with open(os.path.join(args.out, "prefill_malloc.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
