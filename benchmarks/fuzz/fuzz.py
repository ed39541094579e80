"""Fuzz a running speclm server with schemathesis (cases generated from its own /openapi.json, valid
and invalid) plus hand-made hostile requests; count statuses and every answer that breaks the rules:
a 5xx, a body outside OpenAI's error envelope, or a response that does not match the document.

python benchmarks/fuzz/fuzz.py [--url URL | --model M --weights W] --examples N --out benchmarks/fuzz/NAME
(without --url it starts `speclm serve`'s app on loopback itself). The fuzzing itself is tests/fuzz.py,
which the test suite runs briefly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/fuzz/fuzz.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start one here on loopback)")
    p.add_argument("--model", default=None, help="model for the server started here (default: SmolLM2-135M)")
    p.add_argument("--weights", default="int4", help="its weight format (default int4)")
    p.add_argument("--examples", type=int, default=200, help="cases per endpoint and mode (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))  # tests.fuzz (and speclm, when it is not installed)
    from tests.fuzz import fuzz_server, fuzz_target, write_fuzz_report

    if args.url:
        report = fuzz_server(args.url, args.examples, args.seed)
    else:
        from speclm.config import CacheConfig
        from speclm.llm import LLM

        llm = LLM(args.model, weights=args.weights)
        # A 384-token pool bounds every request (fuzzed max_tokens are often huge) so the run stays short.
        with fuzz_target(llm, CacheConfig(num_blocks=24)) as url:
            report = fuzz_server(url, args.examples, args.seed)

    def markdown(report: dict) -> str:
        return (
            f"# Server fuzzing\n\n`{report['command']}`\n\n{report['cases']} cases in {report['seconds']} s; "
            f"statuses {report['statuses']}; engine alive after the run: {report['engine_alive']}; "
            f"rule breaks (5xx other than 503, non-OpenAI error bodies, answers outside the OpenAPI "
            f"document): **{len(report['failures'])}**.\n\n" + "".join(f"- {x}\n" for x in report["failures"][:50])
        )

    report = write_fuzz_report("benchmarks/fuzz/fuzz.py", argv, report, args.out, markdown)
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
