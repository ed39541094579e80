"""What loading `draft:`'s proposer adds to a process's memory: anonymous and file-backed resident MB.

Run it in a fresh process per checkout (the pack cache warm: run it twice, keep the second):

    python benchmarks/draft_vocab/draft_memory.py --draft DRAFT.gguf
"""

from __future__ import annotations

import argparse
import json

from speclm.config import SpecConfig
from speclm.speculative.factory import build_draft_proposer


def resident_mb() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile")))
    return {k: int(v.split()[0]) // 1024 for k, v in fields.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True)
    p.add_argument("--vocab", type=int, default=151936, help="the target's vocabulary size")
    args = p.parse_args()
    before = resident_mb()
    proposer = build_draft_proposer(SpecConfig.parse(f"draft:{args.draft}"), args.vocab)
    after = resident_mb()
    print(json.dumps({k: after[k] - before[k] for k in after} | {"proposer": type(proposer).__name__}))


if __name__ == "__main__":
    main()
