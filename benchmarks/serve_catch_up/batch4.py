"""Four cold chat prompts (code, rag, summarization, qa) in one batch, in process, plain against `draft:` with
the engine's default limits: where a draft model's work goes when it should not draft (issue 35, the draft
server's lag at concurrency 4). Each mode runs twice: the first with nothing cached (a fresh engine's first
batch), the second with the prompts in the prefix cache.

    python benchmarks/serve_catch_up/batch4.py --model TARGET.gguf --draft DRAFT.gguf --name batch4_epyc
"""

from __future__ import annotations

import argparse
import sys
import time

from speclm import SamplingParams
from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report
from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
from speclm.llm import LLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/serve_catch_up")
    p.add_argument("--name", default="batch4")
    args = p.parse_args()
    llm = LLM(args.model, threads=args.threads)
    draft = llm.with_spec(f"draft:{args.draft}")
    texts = [
        q["text"]
        for q in load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", 1, ["code", "rag", "summarization", "qa"])
    ]
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for cached, (mode, engine) in [
        (False, ("plain", llm)),
        (False, ("draft", draft)),
        (True, ("plain", llm)),
        (True, ("draft", draft)),
    ]:
        t0 = time.perf_counter()
        stats = [o.stats for o in engine.generate(prompts, params)]
        rows.append(
            {
                "mode": mode,
                "prompts cached": cached,
                "seconds": time.perf_counter() - t0,
                "drafted": sum(s.drafted_tokens for s in stats),
                "proposer_seconds": sum(s.proposer_seconds for s in stats),
            }
        )
    command = "python " + " ".join(sys.argv)
    lines = [
        *header_lines("A batch of 4 cold prompts in process: plain against draft:", command, machine_info()),
        f"{len(prompts)} prompts, {args.max_tokens} tokens each, greedy, one batch.",
        "",
        "| mode | prompts cached | seconds | drafted tokens | draft-model seconds |",
        "|---|---|---:|---:|---:|",
        *(
            f"| {r['mode']} | {'yes' if r['prompts cached'] else 'no'} | {r['seconds']:.2f} | {r['drafted']} | "
            f"{r['proposer_seconds']:.2f} |"
            for r in rows
        ),
    ]
    write_report(
        args.out, args.name, {"command": command, "machine": machine_info(), "rows": rows}, "\n".join(lines) + "\n"
    )


if __name__ == "__main__":
    main()
