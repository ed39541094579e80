"""speclm and llama.cpp on the same GGUF files, each engine in a fresh process of its own: peak
memory, load to first token, greedy agreement (tokens matched before the first divergence, and there
each engine's logit margin for its own token over the other's) and decoding speed, prompts interleaved;
and llama.cpp's greedy agreement with itself under configurations that compute the same model with other
rounding (the agreement's noise floor).

python benchmarks/gguf_peers/gguf_peers.py --llama-python PYTHON [--models default,target,pair,gemma]
    [--spec ngram,lookahead] --out benchmarks/gguf_peers/NAME

PYTHON is a Python with llama-cpp-python installed (`pip install 'speclm[peers]'`, or a venv of its own so
that llama.cpp's memory is measured without torch); the pair comes from `make pair`, Gemma-3-270M from
`make gemma`. With --spec, speclm also decodes every prompt with each speculative method (a process each):
its tokens per second, and whether its output equals speclm's plain greedy output (it must). --variants names
the llama.cpp configurations whose agreement with llama.cpp's default (and with speclm) is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llama_worker import TOP  # its neighbour in benchmarks/gguf_peers/

WORKER = str(Path(__file__).with_name("llama_worker.py"))


class Worker:
    """An engine in its own process (benchmarks/gguf_peers/llama_worker.py's protocol); `spawned_at` for load timing."""

    def __init__(self, command: list[str], threads: int, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.spawned_at = time.time()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = json.loads(self.proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError(f"worker {command} did not start (exit {self.proc.poll()})")

    def ask(self, **job) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def prompts_for(tokenizer, count: int) -> list[dict]:
    """Half coding prompts of speclm's own, half Spec-Bench prompts of several categories, chat-templated."""
    from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts

    coding = load_prompts(CODING_PROMPTS)[: count // 2]
    general = [p for p in load_prompts(SPECBENCH_PROMPTS, per_category=1) if len(p["text"]) < 1500]
    rows = coding + general[: count - len(coding)]
    return [
        {
            "id": p["id"],
            "category": p["category"],
            "ids": tokenizer.encode_chat([{"role": "user", "content": p["text"]}]),
        }
        for p in rows
    ]


NO_PACK_CACHE = "speclm, no pack cache"
# llama.cpp under configurations that compute the same model with other rounding (llama_cpp.Llama arguments;
# its defaults here: an f16 KV cache, no flash attention, the prompt in one batch). How far its greedy output
# moves from its own is the floor below which agreement with it is a matter of rounding.
LLAMA_VARIANTS = {
    "f32 KV": {"type_k": 0, "type_v": 0},  # GGML_TYPE_F32 keys and values
    "flash attention": {"flash_attn": True},
    "prompt one token per call": {"n_batch": 1, "n_ubatch": 1},
}
LOAD_RUNS = 5  # process starts per engine for the load time (its median; the JSON keeps every start): one varies a lot


def warm_page_cache(path: str) -> None:
    """Read a file once, so that both engines load it from the page cache: otherwise the first engine to
    start pays the disk read and the second one does not."""
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 24):
            pass


def matched(a: list[int], b: list[int]) -> int:
    """How many tokens two outputs share before they first differ."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(
    model: str,
    draft: str | None,
    llama_python: str,
    threads: int,
    prompts: list[dict],
    max_tokens: int,
    specs: list[str] = (),
    variants: list[str] = (),
) -> dict:
    """Both engines on one model (with the draft loaded too when given): memory, load, agreement, speed;
    speclm with each speculative method of `specs`: speed, and exactness against its plain greedy output;
    llama.cpp under each configuration of `variants` (LLAMA_VARIANTS): its output's agreement with llama.cpp's
    and speclm's."""
    for path in [model] + ([draft] if draft else []):
        warm_page_cache(path)
    speclm_cmd = [sys.executable, str(Path(__file__).with_name("speclm_worker.py")), model, str(threads), "auto"]
    speclm_cmd += [f"draft:{draft}"] if draft else []
    llama_cmd = [llama_python, WORKER, model, str(threads)] + ([draft] if draft else [])
    result, workers = {}, {}
    # speclm's loads map the packed weights its first load of the file wrote (speclm/models/pack_cache.py),
    # as llama.cpp's map the file; "speclm, no pack cache" repacks the file on every start.
    starts = (("speclm", speclm_cmd, None), (NO_PACK_CACHE, speclm_cmd, {"SPECLM_PACK_CACHE": "off"}))
    starts += (("llama.cpp", llama_cmd, None),)
    loads: dict[str, list[float]] = {name: [] for name, _, _ in starts}
    try:
        Worker(speclm_cmd, threads).close()  # writes the pack cache entry if there is none
        # Load to first token: process start to the first generated token, one engine at a time (asking the
        # first engine only after the second had loaded counted the second's load in the first's), the
        # engines alternating LOAD_RUNS times; the median is reported and the last processes stay for the rest.
        for _ in range(LOAD_RUNS):
            for name, command, env in starts:
                if name in workers:
                    workers.pop(name).close()
                w = workers[name] = Worker(command, threads, env)
                loads[name].append(
                    w.ask(job="generate", ids=prompts[0]["ids"], max_tokens=1)["first_token_at"] - w.spawned_at
                )
        for name, seconds in loads.items():
            result[name] = {"load_to_first_token_s": statistics.median(seconds), "load_runs_s": seconds}
        no_cache = workers.pop(NO_PACK_CACHE)  # (its peak memory after a load; it decodes as "speclm")
        result[NO_PACK_CACHE]["peak_rss_mb"] = no_cache.ask(job="memory")["peak_rss_mb"]
        no_cache.close()
        for spec in specs:  # (after the load timing: their loads are not timed)
            workers[f"speclm {spec}"] = Worker(speclm_cmd[:5] + [spec], threads)
        runs = {name: [] for name in workers}
        for p in prompts:  # interleaved: a drift in the machine's load hits both engines alike
            for name, w in workers.items():
                runs[name].append(w.ask(job="generate", ids=p["ids"], max_tokens=max_tokens))
        for name in workers:
            result.setdefault(name, {})
            tokens = sum(len(r["tokens"]) for r in runs[name])
            result[name]["tokens_per_s"] = tokens / sum(r["seconds"] for r in runs[name])
            result[name]["tokens_per_s_median_prompt"] = statistics.median(
                len(r["tokens"]) / r["seconds"] for r in runs[name]
            )
        agreement = []
        for p, ours, theirs in zip(prompts, runs["speclm"], runs["llama.cpp"]):
            a, b = ours["tokens"], theirs["tokens"]
            i = matched(a, b)
            row = {"id": p["id"], "category": p["category"], "matched": i}
            if i < min(len(a), len(b)):  # each engine's margin for its own choice over the other's
                for name, mine, other in (("llama.cpp", b[i], a[i]), ("speclm", a[i], b[i])):
                    logits = workers[name].ask(job="logits", ids=p["ids"], then=b[:i], candidates=[mine, other])
                    row[f"logit_gap_{name}"] = logits["logits"][0] - logits["logits"][1]
            agreement.append(row)
        result["agreement"] = agreement
        result["variants"] = {}
        for name in variants:  # (after the timed runs, one process at a time: agreement only)
            w = Worker(llama_cmd[:4] + ["--context", json.dumps(LLAMA_VARIANTS[name])], threads)
            try:
                out = [w.ask(job="generate", ids=p["ids"], max_tokens=max_tokens)["tokens"] for p in prompts]
            finally:
                w.close()
            result["variants"][name] = {
                "vs_llama_cpp": [matched(o, r["tokens"]) for o, r in zip(out, runs["llama.cpp"])],
                "vs_speclm": [matched(o, r["tokens"]) for o, r in zip(out, runs["speclm"])],
            }
        for spec in specs:
            name = f"speclm {spec}"
            result[name]["exact"] = [r["tokens"] for r in runs[name]] == [r["tokens"] for r in runs["speclm"]]
        result["logit_noise"] = [logit_noise(workers, p["ids"]) for p in prompts]
        for name, w in workers.items():
            result[name]["peak_rss_mb"] = w.ask(job="memory")["peak_rss_mb"]
    finally:
        for w in workers.values():
            w.close()
    return result


def logit_noise(workers: dict[str, Worker], ids: list[int]) -> dict:
    """How far the engines' next-token logits after a prompt lie apart, on llama.cpp's most likely tokens
    (the ones a greedy choice is made among), next to how far llama.cpp lies from itself when it reads the
    same prompt one token per call instead of in one batch: the scale below which a divergence is a
    matter of rounding."""
    batched = workers["llama.cpp"].ask(job="logits", ids=ids, then=[], candidates=[])
    top = batched["top"]
    ref = workers["llama.cpp"].ask(job="logits", ids=ids, then=[], candidates=top)["logits"]
    one_by_one = workers["llama.cpp"].ask(job="logits", ids=ids[:1], then=ids[1:], candidates=top)["logits"]
    ours = workers["speclm"].ask(job="logits", ids=ids, then=[], candidates=top)["logits"]

    def rms(x: list[float]) -> float:
        return math.sqrt(sum((a - b) ** 2 for a, b in zip(x, ref)) / len(ref))

    return {"speclm_rms": rms(ours), "llama_cpp_one_by_one_rms": rms(one_by_one)}


def variant_table(report: dict) -> list[str]:
    """The agreement's noise floor: llama.cpp's default output against llama.cpp under other configurations
    (LLAMA_VARIANTS), and speclm's against each, beside speclm's against the default."""
    n = report["max_tokens"]
    lines = [
        f"Agreement's noise floor: the prompts whose {n} greedy tokens two runs share in full, and the tokens "
        "matched per prompt, for llama.cpp under configurations that compute the same model with other rounding "
        "(its default here: f16 KV cache, no flash attention, the prompt in one batch) against its default, "
        "and speclm against each.",
        "",
        f"| model | outputs compared | prompts equal for {n} tokens | tokens matched per prompt |",
        "|---|---|---:|---|",
    ]

    def row(label: str, pair: str, counts: list[int]) -> str:
        full = sum(c == n for c in counts)
        return f"| {label} | {pair} | {full}/{len(counts)} | {', '.join(map(str, counts))} |"

    for label, r in report["results"].items():
        lines.append(row(label, "speclm vs llama.cpp", [a["matched"] for a in r["agreement"]]))
        for name, v in r.get("variants", {}).items():
            lines.append(row(label, f"llama.cpp {name} vs llama.cpp", v["vs_llama_cpp"]))
            lines.append(row(label, f"speclm vs llama.cpp {name}", v["vs_speclm"]))
    return lines


def markdown(report: dict) -> str:
    lines = [
        f"# speclm vs llama.cpp on the same GGUF files ({report['threads']} threads)",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {report['machine'].get('cpu')}, {report['machine'].get('cores')} cores, torch "
        f"{report['machine'].get('torch')}. llama.cpp: {report['llama_cpp']}. Each engine runs in a fresh process "
        "of its own (llama.cpp's without torch); speclm uses `--weights auto` (each tensor on its file's grid). "
        "Load to first token: process start (interpreter, imports, model load, prompt) to the first generated "
        "token, the model files read once beforehand so that both engines load from the page cache; the median of "
        f"{LOAD_RUNS} starts per engine, alternating. speclm's starts map the packed weights that a start before "
        f"the timed ones kept in its pack cache; `{NO_PACK_CACHE}` repacks the file every time "
        "(`SPECLM_PACK_CACHE=off`; a first load). Speed: "
        f"{report['max_tokens']} greedy tokens per prompt, EOS ignored, engines interleaved per "
        "prompt, prefill included. Peak RSS: VmHWM after all runs.",
        "",
        "| model | engine | peak RSS MB | RSS vs llama.cpp | load to first token s | vs llama.cpp | tokens/s "
        "| vs llama.cpp |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in report["results"].items():
        ll = r["llama.cpp"]
        for name in ("speclm", NO_PACK_CACHE, "llama.cpp"):
            if name not in r:  # (a report from before the pack cache)
                continue
            e = r[name]
            load, ll_load = e["load_to_first_token_s"], ll["load_to_first_token_s"]
            rss = speed = "- | -"
            if "peak_rss_mb" in e:
                rss = f"{e['peak_rss_mb']:.0f} | {e['peak_rss_mb'] / ll['peak_rss_mb']:.2f}x"
            if "tokens_per_s" in e:
                speed = f"{e['tokens_per_s']:.1f} | {e['tokens_per_s'] / ll['tokens_per_s']:.2f}x"
            lines.append(f"| {label} | {name} | {rss} | {load:.2f} | {load / ll_load:.2f}x | {speed} |")
    spec_rows = [
        f"| {label} | {name} | {e['tokens_per_s']:.1f} | {e['tokens_per_s'] / r['speclm']['tokens_per_s']:.2f}x "
        f"| {e['tokens_per_s'] / r['llama.cpp']['tokens_per_s']:.2f}x | {'yes' if e['exact'] else 'NO'} |"
        for label, r in report["results"].items()
        for name, e in r.items()
        if name.startswith("speclm ") and "exact" in e
    ]
    if spec_rows:
        lines += [
            "",
            "speclm's speculative methods on the same prompts (interleaved with the runs above): tokens/s against "
            "speclm's plain decoding and llama.cpp's, and whether every prompt's output equals speclm's plain "
            "greedy output.",
            "",
            "| model | engine | tokens/s | vs speclm | vs llama.cpp | equal to plain greedy |",
            "|---|---|---:|---:|---:|---|",
            *spec_rows,
        ]
    lines += [
        "",
        f"Greedy agreement ({report['max_tokens']} tokens): tokens before the first divergence from "
        "llama.cpp's output, and there each engine's logit for its own token minus its logit for the other's "
        "(its margin; both engines' logits computed on the common prefix as their generation computed them). "
        "A divergence where both margins are small is a near-tie that rounding decides.",
        "",
        "| model | prompt | category | matched | llama.cpp's margin | speclm's margin |",
        "|---|---|---|---:|---:|---:|",
    ]
    for label, r in report["results"].items():
        for a in r["agreement"]:
            gaps = [f"{a[key]:.3f}" if key in a else "-" for key in ("logit_gap_llama.cpp", "logit_gap_speclm")]
            lines.append(f"| {label} | {a['id']} | {a['category']} | {a['matched']} | {gaps[0]} | {gaps[1]} |")
    if any(r.get("variants") for r in report["results"].values()):
        lines += ["", *variant_table(report)]
    lines += [
        "",
        "Logit noise: the root mean square difference of the next-token logits after each prompt, on llama.cpp's "
        f"{TOP} most likely tokens, from llama.cpp's (the prompt in one batch); beside it llama.cpp against itself "
        "when it reads the prompt one token per call. Range over the prompts.",
        "",
        "| model | speclm vs llama.cpp | llama.cpp one token per call vs llama.cpp |",
        "|---|---:|---:|",
    ]
    for label, r in report["results"].items():
        noise = r.get("logit_noise")
        if noise:
            cells = [
                f"{min(n[k] for n in noise):.3f}-{max(n[k] for n in noise):.3f}"
                for k in ("speclm_rms", "llama_cpp_one_by_one_rms")
            ]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from speclm.bench.machine import machine_info
    from speclm.data.gemma import gemma_path
    from speclm.data.pair import pair_path
    from speclm.models.loader import default_model_path
    from speclm.tokenizer import load_tokenizer

    p = argparse.ArgumentParser(prog="python benchmarks/gguf_peers/gguf_peers.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-python", required=True, help="a Python executable with llama-cpp-python installed")
    p.add_argument("--llama-cpp", default="llama-cpp-python", help="how that llama.cpp was built (for the report)")
    p.add_argument(
        "--models", default="default,target,pair", help="default, target (the 1.5B), pair (+ the 0.5B), gemma"
    )
    p.add_argument("--spec", default="", help="speclm's speculative methods to run too, e.g. ngram,lookahead")
    p.add_argument(
        "--variants",
        default=",".join(LLAMA_VARIANTS),
        help=f"llama.cpp configurations to measure its agreement with itself under ({', '.join(LLAMA_VARIANTS)}; "
        "comma-separated, empty for none)",
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v and v not in LLAMA_VARIANTS]
    if unknown:
        p.error(f"unknown --variants {', '.join(unknown)} (known: {', '.join(LLAMA_VARIANTS)})")
    wanted = args.models.split(",")
    if args.out:  # made now: a missing folder must not lose a finished run's results
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if any(m in wanted for m in ("target", "pair")) and not pair_path("target"):
        raise SystemExit("the real pair is missing: run `make pair` first")
    if "gemma" in wanted and not gemma_path():
        raise SystemExit("Gemma-3-270M is missing: run `make gemma` first")
    models = {
        "default": (default_model_path(), None),
        "target": (pair_path("target"), None),
        "pair": (pair_path("target"), pair_path("draft")),
        "gemma": (gemma_path(), None),
    }
    results = {}
    for label in wanted:
        model, draft = models[label]
        prompts = prompts_for(load_tokenizer(model, None), args.prompts)
        print(f"{label}: {len(prompts)} prompts ...", file=sys.stderr, flush=True)
        specs = [m for m in args.spec.split(",") if m]
        variants = [v for v in args.variants.split(",") if v]
        results[label] = compare(
            model, draft, args.llama_python, args.threads, prompts, args.max_tokens, specs, variants
        )
    report = {
        "command": "python benchmarks/gguf_peers/gguf_peers.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine_info(),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "spec": args.spec,
        "llama_cpp": args.llama_cpp,
        "results": results,
    }
    table = markdown(report)
    print(table)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
        Path(f"{args.out}.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
