"""The two probes behind serve_catch_up/README.md's reading, on the real pair (needs `make pair`):

    python benchmarks/serve_catch_up/probes.py qa --out benchmarks/serve_catch_up
        the Spec-Bench qa prompt with the draft (`draft:`, the hybrid), in-process, four times in a row, 256
        tokens (ignore_eos, as `speclm bench serve`), and plain decoding twice: seconds, tau, drafts
    python benchmarks/serve_catch_up/probes.py concurrency4 --out benchmarks/serve_catch_up
        8 requests of 256 tokens at concurrency 4 through the server (prefix cache warm), plain then the draft,
        twice; with the draft, every catch-up of the draft model over 50 ms and every priced one (the rule's
        verdict), and the server's draft counters

Each writes probes_NAME.json and probes_NAME.md (the machine named).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request

PAIR = os.path.expanduser("~/.cache/speclm/pair/")
TARGET, DRAFT = PAIR + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", PAIR + "qwen2.5-coder-0.5b-instruct-q5_0.gguf"
CATEGORIES = "code,coding,math_reasoning,qa,rag,summarization,translation,extraction".split(",")


def qa(llm, lines: list[str]) -> dict:
    from speclm import SamplingParams
    from speclm.data import SPECBENCH_PROMPTS, load_prompts

    messages = [{"role": "user", "content": load_prompts(SPECBENCH_PROMPTS, 1, ["qa"])[0]["text"]}]
    draft = llm.with_spec(f"draft:{DRAFT}")
    params = SamplingParams(max_tokens=256, ignore_eos=True)
    runs = []
    for name, served in [("plain", llm)] * 2 + [("draft", draft)] * 4:
        t0 = time.perf_counter()
        out = served.chat(messages, params)
        s = out.stats
        runs.append(dict(mode=name, seconds=round(time.perf_counter() - t0, 2), tau=round(s.mean_accepted_length, 2),
                         drafted=s.drafted_tokens, accepted=s.accepted_tokens))  # fmt: skip
        print(runs[-1], file=sys.stderr, flush=True)
    lines += ["| mode | seconds | tau | drafted | accepted |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['seconds']} | {r['tau']} | {r['drafted']} | {r['accepted']} |" for r in runs]
    return {"runs": runs}


def concurrency4(llm, lines: list[str]) -> dict:
    import speclm.engine.speculation as speculation
    import speclm.speculative.draft_model as draft_model
    from speclm.bench.serve_bench import run_levels
    from speclm.config import CacheConfig
    from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig
    from speclm.server.launch import serve_while

    events, t0 = [], time.perf_counter()
    catch_up, pays = draft_model.DraftModelProposer._catch_up, speculation.Speculation._catch_up_pays

    def timed_catch_up(self, context):  # (observation only: the same call, timed)
        start = time.perf_counter()
        logits = catch_up(self, context)
        if time.perf_counter() - start > 0.05:
            events.append(["catch-up", round(start - t0, 2), len(context), round(time.perf_counter() - start, 3)])
        return logits

    def priced(self, proposer, context, wanted):
        verdict = pays(self, proposer, context, wanted)
        if proposer.catch_up_seconds(context) > 0:
            events.append(["priced", round(time.perf_counter() - t0, 2), len(context), wanted, verdict])
        return verdict

    draft_model.DraftModelProposer._catch_up, speculation.Speculation._catch_up_pays = timed_catch_up, priced
    texts = [q["text"] for q in load_prompts(f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}", 1, CATEGORIES)]
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    draft = llm.with_spec(f"draft:{DRAFT}", 4, True)
    runs = []
    for name, served in [("plain", llm), ("draft", draft)] * 2:

        def job(url, name=name):
            run_levels({name: url}, prompts, [(1, len(prompts))], 2)  # the prompts into the prefix cache
            events.append(["concurrency 4 starts", round(time.perf_counter() - t0, 2)])
            rows = run_levels({name: url}, prompts, [(4, len(prompts))], 256)[name]
            metrics = urllib.request.urlopen(url + "/metrics").read().decode()
            keep = ("speclm_spec_drafted_tokens_total", "speclm_spec_accepted_tokens_total", "speclm_decode_")
            return rows[0], [m for m in metrics.splitlines() if m.startswith(keep) and "_created" not in m]

        row, counters = serve_while(build_app(served, CacheConfig(), ServerConfig(model_name="x")), job)
        runs.append({"mode": name, "tokens_per_s": round(row["tokens_per_s"], 1), "counters": counters})
        print(runs[-1], file=sys.stderr, flush=True)
    lines += ["| mode | tokens/s at concurrency 4 |", "|---|---:|"]
    lines += [f"| {r['mode']} | {r['tokens_per_s']} |" for r in runs]
    lines += ["", "Draft runs' counters (all phases, the warm-up's 2-token requests included):", ""]
    lines += [f"- {r['mode']}: " + "; ".join(r["counters"]) for r in runs if r["mode"] == "draft"]
    lines += ["", "Catch-ups over 50 ms and priced catch-ups (seconds since start, context tokens, ...):", ""]
    lines += [f"- {e}" for e in events]
    return {"runs": runs, "events": events}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=["qa", "concurrency4"])
    p.add_argument("--out", default=".")
    args = p.parse_args()
    from speclm import LLM
    from speclm.bench.machine import machine_info
    from speclm.bench.report import write_report

    command = "python benchmarks/serve_catch_up/probes.py " + " ".join(sys.argv[1:])
    machine = machine_info()
    lines = [f"# serve_catch_up probe: {args.probe}", "", f"Command: `{command}`", "",
             f"Machine: {machine['cpu']}, 2 threads; the real pair.", ""]  # fmt: skip
    llm = LLM(TARGET, threads=2)
    result = (qa if args.probe == "qa" else concurrency4)(llm, lines)
    payload = {"command": command, "machine": machine, **result}
    write_report(args.out, f"probes_{args.probe}", payload, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
