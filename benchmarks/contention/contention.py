"""How generation degrades when other processes keep the CPU busy, under each OpenMP wait policy.

python benchmarks/contention/contention.py [--busy 0,1,2] [--out benchmarks/contention/NAME]

For each number of busy processes (pure-Python spin loops) and each setting, a fresh process loads the
default model and times a short chat generation (prefill + decoding) three times; the median is kept.
Settings: all cores with OpenMP's defaults, active waiting (threads spin between parallel regions), a
short spin before sleeping, or passive waiting (threads sleep at once); one thread; and speclm's
default, which counts the cores idle at load time (speclm/threads.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

from speclm.bench.machine import machine_info
from speclm.bench.report import output_paths, write_json

ALL = str(os.cpu_count() or 1)
SETTINGS = {
    "all cores, OpenMP defaults": {"SPECLM_BENCH_THREADS": ALL},
    "all cores, active wait": {"SPECLM_BENCH_THREADS": ALL, "OMP_WAIT_POLICY": "ACTIVE"},
    "all cores, short spin (GOMP_SPINCOUNT=10000)": {"SPECLM_BENCH_THREADS": ALL, "GOMP_SPINCOUNT": "10000"},
    "all cores, passive wait": {"SPECLM_BENCH_THREADS": ALL, "OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"SPECLM_BENCH_THREADS": "1"},
    "speclm's default (the idle cores)": {},
}

PROBE = """
import json, os, time
from speclm import LLM, SamplingParams
threads = int(os.environ.get("SPECLM_BENCH_THREADS", "0")) or None
llm = LLM(threads=threads)
ids = llm.tokenizer.encode_chat([{"role": "user", "content": "List three uses of a hash map, one line each."}])
llm.generate(ids, SamplingParams(max_tokens=2))
times = []
for _ in range(3):
    t0 = time.perf_counter()
    llm.generate(ids, SamplingParams(max_tokens=16, ignore_eos=True))
    times.append(time.perf_counter() - t0)
print(json.dumps({"seconds": times, "prompt_tokens": len(ids)}))
"""


def spin() -> None:
    while True:
        pass


def measure(env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", default="0,1,2", help="comma-separated counts of busy processes (default 0,1,2)")
    ap.add_argument("--out", default="benchmarks/contention/contention", help="output path without extension")
    args = ap.parse_args()
    rows = []
    for busy in [int(b) for b in args.busy.split(",")]:
        hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
        for h in hogs:
            h.start()
        try:
            for name, env in SETTINGS.items():
                t0 = time.perf_counter()
                result = measure(env)
                median = statistics.median(result["seconds"])
                rows.append(
                    {"busy_processes": busy, "setting": name, **result, "runs": result["seconds"], "seconds": median}
                )
                print(f"busy {busy}  {name:26s} {median:7.2f} s  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        finally:
            for h in hogs:
                h.terminate()
    out_dir, name = os.path.split(args.out)
    paths = output_paths(out_dir or ".", name)
    command = "python benchmarks/contention/contention.py " + " ".join(sys.argv[1:])
    machine = machine_info()
    write_json(paths["json"], {"command": command, "machine": machine, "rows": rows})
    lines = [
        "# Generation under CPU contention (default model, 16 tokens after a chat prompt)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores. Median of 3 generations, each in a "
        "fresh process per setting; busy processes are pure-Python spin loops.",
        "",
        "| busy processes | setting | seconds per request | vs all cores, OpenMP defaults |",
        "|---:|---|---:|---:|",
    ]
    for row in rows:
        base = next(r for r in rows if r["busy_processes"] == row["busy_processes"] and r["setting"].startswith("all"))
        lines.append(
            f"| {row['busy_processes']} | {row['setting']} | {row['seconds']:.2f} | "
            f"{row['seconds'] / base['seconds']:.2f}x |"
        )
    with open(paths["md"], "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
