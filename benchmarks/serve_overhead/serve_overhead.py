"""Where the draft path loses time through the server: the same prompts in-process on the loading thread and
through `speclm serve`'s launch (engine on this thread, uvicorn on another; the HTTP clients in a process of
their own, or on a thread of this one), interleaved per repeat. Besides tokens/s it reports the engine
steps' wall time and the engine thread's CPU time within them: a step slower in wall time but not in CPU
time waited (for the GIL, or for a core another thread took).

python benchmarks/serve_overhead/serve_overhead.py --model TARGET --draft DRAFT [--prompts N] [--max-tokens T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", type=int, default=1, help="prompts per category")
    p.add_argument("--categories", default="code")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--modes", default="inprocess,server,server_thread_client")
    p.add_argument("--methods", default="draft,ar")
    args = p.parse_args()

    from speclm import LLM
    from speclm.bench.serve_bench import run_levels, time_in_process
    from speclm.bench.serve_client import run_level
    from speclm.config import CacheConfig
    from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
    from speclm.engine.engine import Engine
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig
    from speclm.server.launch import serve_while

    cats = args.categories.split(",")
    files = CODING_PROMPTS if cats == ["code"] else f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}"
    texts = [q["text"] for q in load_prompts(files, args.prompts, cats)]
    llm = LLM(args.model, threads=2)
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]

    timer = {"wall": 0.0, "cpu": 0.0, "steps": 0}
    step = Engine.step

    def timed_step(self):
        w, c = time.perf_counter(), time.thread_time()
        out = step(self)
        timer["wall"] += time.perf_counter() - w
        timer["cpu"] += time.thread_time() - c
        timer["steps"] += 1
        return out

    Engine.step = timed_step
    served = {m: llm if m == "ar" else llm.with_spec(f"draft:{args.draft}", 4, True) for m in args.methods.split(",")}
    for _ in range(args.repeats):
        for method, s in served.items():
            for mode in args.modes.split(","):
                timer.update(wall=0.0, cpu=0.0, steps=0)
                t0 = time.perf_counter()
                if mode == "inprocess":
                    r = time_in_process(s.with_engine(), prompts, args.max_tokens)  # fresh caches, as the server
                else:
                    app = build_app(s, CacheConfig(), ServerConfig(model_name="x"))
                    if mode == "server":

                        def work(url):
                            return run_levels(url, prompts, [(1, len(prompts))], args.max_tokens)[0]
                    else:

                        def work(url):
                            asyncio.run(run_level(url, prompts, 1, 1, 4))
                            return asyncio.run(run_level(url, prompts, 1, len(prompts), args.max_tokens))

                    r = serve_while(app, work)
                total = time.perf_counter() - t0
                row = {"method": method, "mode": mode, "tokens_per_s": round(r["tokens_per_s"], 2)}
                row.update(steps=timer["steps"], step_wall_s=round(timer["wall"], 2), step_cpu_s=round(timer["cpu"], 2))
                row["run_s"] = round(total, 2)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
