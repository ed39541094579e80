"""How long a first use of speclm's CPU kernels takes to compile them (a fresh build folder each time): the wall
time and the compiler's CPU time, for the checkouts given (each one's own `speclm`: run in its folder, with
PYTHONPATH set to it). Each round builds every checkout once, in turn. Nothing else should run meanwhile.

`python benchmarks/kernel_build/build_time.py --checkouts OLD,NEW --out DIR` writes DIR/build_time.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, write_report

BUILD = "from speclm.kernels import cpu_kernels; assert cpu_kernels() is not None"


def build_once(checkout: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the build's processes) of one build of `checkout`'s kernels."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": checkout, "SPECLM_KERNEL_CACHE": cache}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", BUILD], env=env, cwd=checkout, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/kernel_build/build_time.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkouts", required=True, help="comma-separated repository folders")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/kernel_build")
    args = parser.parse_args(argv)
    checkouts = [os.path.abspath(c) for c in args.checkouts.split(",")]
    commits = {
        c: subprocess.run(
            ["git", "-C", c, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for c in checkouts
    }
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in checkouts}
    for _ in range(args.rounds):
        for c in checkouts:
            times[c].append(build_once(c))
            print(f"{commits[c]}: wall {times[c][-1][0]:.1f} s, CPU {times[c][-1][1]:.1f} s", flush=True)
    command = "python benchmarks/kernel_build/build_time.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    median = {
        c: (statistics.median(w for w, _ in times[c]), statistics.median(u for _, u in times[c])) for c in checkouts
    }
    rows = [
        f"| {commits[c]} | {median[c][0]:.1f} | {median[c][1]:.1f} | {', '.join(f'{w:.0f}' for w, _ in times[c])} |"
        for c in checkouts
    ]
    lines = [
        *header_lines("Compiling speclm's CPU kernels on first use", command, machine, threads=os.cpu_count()),
        f"A fresh build folder each time; medians of {args.rounds} rounds.",
        "",
        "| checkout | wall s | compiler CPU s | each round's wall s |",
        "|---|---:|---:|---|",
        *rows,
    ]
    payload = {"machine": machine, "command": command, "commits": commits, "seconds": times}
    write_report(args.out, "build_time", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
