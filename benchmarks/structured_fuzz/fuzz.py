"""Fuzz a speclm server's structured outputs (tests/structured_fuzz.py): JSON schemas from a hypothesis
strategy, regexes, choices, grammars and invalid constraints, greedy and sampled, on both endpoints;
count statuses, finish reasons, 5xx / dead-engine failures and "stop" outputs invalid against their
constraint.

python benchmarks/structured_fuzz/fuzz.py [--model M] [--spec S] --cases N --out benchmarks/structured_fuzz/NAME
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/structured_fuzz/fuzz.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model (default: SmolLM2-135M)")
    p.add_argument("--spec", default=None, help="speculative method of the server (default: none)")
    p.add_argument("--cases", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from speclm.config import CacheConfig
    from speclm.llm import LLM
    from tests.fuzz import fuzz_target, write_fuzz_report
    from tests.structured_fuzz import fuzz_structured

    llm = LLM(args.model, spec=args.spec)
    chat = llm.tokenizer.chat_template is not None
    with fuzz_target(llm, CacheConfig(kv_cache_mb=64)) as url:
        report = fuzz_structured(url, args.cases, args.seed, args.max_tokens, chat=chat)

    def markdown(report: dict) -> str:
        return (
            f"# Structured-output fuzzing\n\n`{report['command']}`\n\n{report['cases']} cases in "
            f"{report['seconds']:.0f} s; statuses {report['statuses']}; finish reasons "
            f"{report['finish_reasons']}; failures (5xx, a bad constraint not answered 400, a dead "
            f'engine): **{len(report["failures"])}**; "stop" outputs invalid against their constraint: '
            f"**{len(report['invalid'])}**.\n\n"
            + "".join(f"- {x}\n" for x in (report["failures"] + report["invalid"])[:50])
        )

    report = write_fuzz_report("benchmarks/structured_fuzz/fuzz.py", argv, report, args.out, markdown)
    return 0 if not (report["failures"] or report["invalid"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
