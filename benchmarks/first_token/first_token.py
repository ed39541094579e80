"""A/B behind removing Sequence.hold_last: speculating sequences holding their last prompt token back from
prefill (the engine before) or not (the prompt's pass commits the first token, as plain decoding's does).

It patches the property the engine had then (Sequence.num_schedulable), so it runs against a checkout from
before the removal, e.g. `git worktree add /tmp/before ba9a964`:

    PYTHONPATH=/tmp/before flock /tmp/speclm_bench.lock python benchmarks/first_token/first_token.py TARGET DRAFT 256

The pair, 2 threads, 16 chat prompts (2 per category), greedy, EOS ignored, the two modes alternating per prompt;
one JSON line per prompt, then tokens/s over all, mean TTFT and tau, and whether every output was equal.
"""

import contextlib
import json
import sys
import time
from unittest import mock

from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
from speclm.engine.sequence import Sequence
from speclm.llm import LLM
from speclm.sampling_params import SamplingParams

CATEGORIES = "code,coding,math,qa,rag,writing,summarization,translation".split(",")


def mode_context(mode: str):
    """nohold: every sequence schedules all its uncomputed tokens (the last prompt token included)."""
    if mode == "hold":
        return contextlib.nullcontext()
    return mock.patch.object(Sequence, "num_schedulable", property(lambda s: s.num_uncomputed))


def main() -> None:
    model, draft = sys.argv[1], sys.argv[2]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    target = LLM(model, threads=2)
    engines = {"hold": target.with_spec(f"draft:{draft}"), "nohold": target.with_spec(f"draft:{draft}")}
    prompts = load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", 2, CATEGORIES)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for mode, engine in engines.items():  # warm-up
        with mode_context(mode):
            engine.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=8))
    rows = []
    for i, prompt in enumerate(prompts):
        row, outputs = {"category": prompt["category"]}, {}
        for mode in ["hold", "nohold"] if i % 2 == 0 else ["nohold", "hold"]:
            with mode_context(mode):
                t0 = time.perf_counter()
                out = engines[mode].chat([{"role": "user", "content": prompt["text"]}], params)
                seconds = time.perf_counter() - t0
            outputs[mode] = out.token_ids
            stats = out.stats
            row[mode] = dict(seconds=seconds, ttft=stats.prefill_seconds, tokens=len(out.token_ids))
            row[mode]["tau"] = stats.mean_accepted_length
        row["equal"] = outputs["hold"] == outputs["nohold"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    for mode in engines:
        rate = sum(r[mode]["tokens"] for r in rows) / sum(r[mode]["seconds"] for r in rows)
        ttft = sum(r[mode]["ttft"] for r in rows) / len(rows)
        tau = sum(r[mode]["tau"] for r in rows) / len(rows)
        print(mode, "tokens/s", round(rate, 2), "ttft mean", round(ttft, 3), "tau", round(tau, 3))
    print("all equal", all(r["equal"] for r in rows))


if __name__ == "__main__":
    main()
