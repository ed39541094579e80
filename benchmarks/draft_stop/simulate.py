"""Where should a draft model end its chain? A simulation over teacher-forced traces (collect.py): the engine's
K controller (speclm/speculative/controller.py, the real class) picks K each step, the draft proposes up to K
tokens and, with a stop P, ends the chain after the first draft where the product of its top probabilities
falls below P; a step commits the drafts up to the first the target disagrees with, plus one. A step costs K
draft passes and a verification pass over K + 1 rows, from the costs given (defaults: the real pair's step
anatomy on the AMD EPYC VM with AVX-512, benchmarks/draft_layers/step_anatomy.md). Decoding only: no prompt
lookup, no prefill. After a rejected draft the trace's own probabilities stand in for the draft's off the
target's path. Usage:

    python benchmarks/draft_stop/simulate.py --traces benchmarks/draft_stop/traces.json --out benchmarks/draft_stop
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speclm.speculative.controller import SpeculationController

GRID = [(4, 0.0), (8, 0.0), (4, 0.3), (4, 0.5), (6, 0.5), (8, 0.3), (8, 0.4), (8, 0.5), (8, 0.6), (12, 0.5)]


def simulate(run: dict, max_k: int, stop: float, draft_ms: float, verify_ms: float, row_ms: float) -> tuple[int, float]:
    """(tokens, ms) of decoding one trace's answer."""
    top, agree = run["p_top"], run["agree"]
    controller = SpeculationController(max_k=max_k)
    t, ms = 0, 0.0
    while t < len(agree):
        k = controller.next_k()
        if k == 0:
            ms += verify_ms
            t += 1
            continue
        drafts, sure = 0, 1.0
        while drafts < k and t + drafts < len(agree):
            sure *= top[t + drafts]
            drafts += 1
            if sure < stop:
                break
        accepted = 0
        while accepted < drafts and agree[t + accepted]:
            accepted += 1
        draft_cost, verify_cost = drafts * draft_ms, verify_ms + row_ms * drafts
        ms += draft_cost + verify_cost
        controller.record(drafts, accepted, draft_cost, verify_cost)
        t += accepted + 1
    return len(agree), ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="benchmarks/draft_stop/traces.json")
    parser.add_argument("--out", default="benchmarks/draft_stop")
    parser.add_argument("--draft-ms", type=float, default=8.1, help="a draft pass (default 8.1)")
    parser.add_argument("--verify-ms", type=float, default=33.7, help="a one-row target pass (default 33.7)")
    parser.add_argument("--row-ms", type=float, nargs="+", default=[1.2, 3.0], help="each further row (1.2 3.0)")
    args = parser.parse_args()
    runs = json.loads(Path(args.traces).read_text())
    categories = sorted({r["category"] for r in runs})
    rows = []
    for row_ms in args.row_ms:
        for max_k, stop in GRID:
            totals: dict[str, list[float]] = {c: [0, 0.0] for c in categories + ["overall"]}
            for run in runs:
                n, ms = simulate(run, max_k, stop, args.draft_ms, args.verify_ms, row_ms)
                for key in (run["category"], "overall"):
                    totals[key][0] += n
                    totals[key][1] += ms
            speedup = {c: args.verify_ms * n / ms for c, (n, ms) in totals.items()}  # vs plain decoding
            rows.append({"row_ms": row_ms, "max_k": max_k, "stop": stop, "speedup": speedup})
    rows_ms = " ".join(map(str, args.row_ms))
    command = (
        f"python benchmarks/draft_stop/simulate.py --traces {args.traces} --out {args.out} "
        f"--draft-ms {args.draft_ms} --verify-ms {args.verify_ms} --row-ms {rows_ms}"
    )
    out = Path(args.out)
    (out / "simulate.json").write_text(json.dumps({"command": command, "costs": vars(args), "rows": rows}, indent=1))
    columns = ["overall"] + categories
    md = [
        "# Simulated decoding speed of the real pair by K and stop, over teacher-forced traces",
        "",
        f"Command: `{command}`",
        "",
        f"Costs: a draft pass {args.draft_ms} ms, a one-row target pass {args.verify_ms} ms, each further row "
        "as in the first column. Speed: against plain decoding of the same tokens (a one-row pass each).",
        "",
        "| ms a row | max K | stop | " + " | ".join(columns) + " |",
        "|---:|---:|---:|" + "---:|" * len(columns),
    ]
    for r in rows:
        cells = " | ".join(f"{r['speedup'][c]:.3f}" for c in columns)
        md.append(f"| {r['row_ms']} | {r['max_k']} | {r['stop']} | {cells} |")
    (out / "simulate.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
