"""Structured outputs and tool calls through the servers: speclm serve (constrained AR, constrained
speculation with `draft:` (the hybrid) and with the draft model alone, constrained n-gram) against
llama.cpp's llama-server with the same response_format / tools, on a JSON-extraction workload (schemas
over passages of our own) and a tool-calling workload (tool_choice "required"), greedy, one request at a
time.

Each request is sent twice: first with max_tokens 1 (its time is the cold time to first token; it leaves
the prompt in both servers' prompt caches), then in full, timed: its tokens/s is decoding with the prompt
cached, the same measure for every row. Outputs are checked against their schemas; the grammar's share of
the tokens (forced) and of the time (mask and matcher work) come from speclm's /metrics
(speclm_grammar_*), tau from its speclm_decode_* counters.

python benchmarks/structured_pair/structured_pair.py [--model M] [--draft D] [--threads 2]
    [--rows ar,draft,ngram,plain,llama-server] [--limit N] --llama-bin DIR --out benchmarks/structured_pair/NAME
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).resolve().parent / "workload.json"
ROWS = ("ar", "draft", "draft-model", "ngram", "plain", "llama-server")
LABELS = {
    "ar": "speclm, constrained AR",
    "draft": "speclm, `draft:` (the hybrid: under a grammar, forced tokens + lookup)",
    "draft-model": "speclm, `draft:...,lookup=off` (draft model + forced tokens)",
    "ngram": "speclm, constrained n-gram (+ forced tokens)",
    "plain": "speclm, unconstrained AR (same token counts as constrained AR)",
    "llama-server": "llama-server, json_schema / tools",
}
SYSTEM = "You extract information. Answer with JSON only."


def requests_of(workload: dict, limit: int | None) -> list[dict]:
    """The chat requests of both workloads: {kind, name, body, schema(s)}."""
    out = []
    for task in workload["extraction"][:limit]:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{task['instruction']}\n\n{task['text']}"},
        ]
        response_format = {"type": "json_schema", "json_schema": {"name": task["name"], "schema": task["schema"]}}
        out.append(
            {"kind": "json", "name": task["name"], "body": {"messages": messages, "response_format": response_format}}
        )
    tools = workload["tools"]
    for i, prompt in enumerate(workload["tool_prompts"][:limit]):
        body = {"messages": [{"role": "user", "content": prompt}], "tools": tools, "tool_choice": "required"}
        out.append({"kind": "tools", "name": f"tool_{i}", "body": body})
    return out


def check(request: dict, choice: dict, tools: list[dict]) -> str | None:
    """None when the output is complete and valid against its schema(s), else why not."""
    import jsonschema

    message = choice["message"]
    if request["kind"] == "json":
        if choice["finish_reason"] != "stop":
            return f"finish_reason {choice['finish_reason']}"
        try:
            jsonschema.validate(
                json.loads(message.get("content") or ""), request["body"]["response_format"]["json_schema"]["schema"]
            )
        except (ValueError, jsonschema.ValidationError) as e:
            return f"invalid: {str(e)[:120]}"
        return None
    calls = message.get("tool_calls") or []
    if choice["finish_reason"] not in ("tool_calls", "stop") or not calls:
        return (
            f"no tool call (finish_reason {choice['finish_reason']}, content {(message.get('content') or '')[:80]!r})"
        )
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        name = call["function"]["name"]
        if name not in schemas:
            return f"unknown tool {name!r}"
        try:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"invalid arguments of {name}: {str(e)[:120]}"
    return None


def metrics(url: str) -> dict[str, float]:
    """speclm's counters the table reads (zeros for a server without them)."""
    import httpx

    names = ("speclm_grammar_tokens_total", "speclm_grammar_forced_tokens_total", "speclm_grammar_seconds_total")
    names += ("speclm_decode_steps_total", "speclm_decode_tokens_total")
    response = httpx.get(f"{url}/metrics", timeout=30)
    values = dict.fromkeys(names, 0.0)
    if response.status_code == 200:
        for line in response.text.splitlines():
            key, _, value = line.partition(" ")
            if key in values:
                values[key] = float(value)
    return values


def run_requests(url: str, requests: list[dict], tools: list[dict], max_tokens: list[int] | None, speclm: bool) -> dict:
    """Every request, warm-up then timed (max_tokens[i] with ignore_eos for the unconstrained row)."""
    import httpx

    rows = []
    with httpx.Client(timeout=900, limits=httpx.Limits(max_keepalive_connections=0)) as client:

        def post(body: dict) -> tuple[dict, float]:
            t0 = time.perf_counter()
            response = client.post(f"{url}/v1/chat/completions", json={**body, "model": "m", "temperature": 0})
            seconds = time.perf_counter() - t0
            if response.status_code != 200:
                raise RuntimeError(f"request failed: {response.status_code} {response.text[:500]}")
            return response.json(), seconds

        for i, request in enumerate(requests):
            body = request["body"]
            if max_tokens is not None:  # the same prompt, free text, as many tokens as constrained AR made
                body = {"messages": body["messages"], "max_tokens": max_tokens[i], "ignore_eos": True}
            _, ttft = post({**body, "max_tokens": 1})
            before = metrics(url) if speclm else None
            answer, seconds = post({"max_tokens": 384, **body})
            after = metrics(url) if speclm else None
            choice = answer["choices"][0]
            row = {
                "kind": request["kind"],
                "name": request["name"],
                "ttft": ttft,
                "seconds": seconds,
                "tokens": answer["usage"]["completion_tokens"],
                "finish_reason": choice["finish_reason"],
                "output": choice["message"].get("tool_calls") or choice["message"].get("content"),
                "error": None if max_tokens is not None else check(request, choice, tools),
            }
            if speclm:
                row["metrics"] = {k: after[k] - before[k] for k in after}
            rows.append(row)
            print(
                f"  {request['name']}: {row['tokens']} tokens in {seconds:.2f} s ({row['error'] or 'ok'})",
                file=sys.stderr,
            )
    return {"requests": rows}


def summary(rows: list[dict], ar_seconds_per_token: float | None) -> dict:
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    out = {
        "requests": len(rows),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "valid": sum(r["error"] is None for r in rows),
        "ttft_mean": sum(r["ttft"] for r in rows) / len(rows) if rows else 0.0,
    }
    if rows and "metrics" in rows[0]:
        m = {k: sum(r["metrics"][k] for r in rows) for k in rows[0]["metrics"]}
        constrained = m["speclm_grammar_tokens_total"]
        out["tau"] = (
            m["speclm_decode_tokens_total"] / m["speclm_decode_steps_total"] if m["speclm_decode_steps_total"] else None
        )
        if constrained:
            out["forced_share"] = m["speclm_grammar_forced_tokens_total"] / constrained
            out["grammar_us_per_token"] = 1e6 * m["speclm_grammar_seconds_total"] / constrained
            if ar_seconds_per_token:
                out["grammar_share_of_target_token"] = 1e-6 * out["grammar_us_per_token"] / ar_seconds_per_token
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/structured_pair/structured_pair.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default=None, help="target (default: SmolLM2-135M, for development)")
    p.add_argument("--draft", default=None, help="draft model of the draft row (default: the target itself)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--k", type=int, default=4, help="speculative tokens (adaptive)")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--limit", type=int, default=None, help="the first N tasks of each workload")
    p.add_argument("--llama-bin", default=None, help="llama.cpp's programs (llama-server)")
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from speclm.bench.llama_server import LlamaServerPeer
    from speclm.bench.machine import machine_info
    from speclm.config import CacheConfig
    from speclm.llm import LLM
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig
    from speclm.server.launch import serve_while

    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if unknown := set(rows) - set(ROWS):
        raise SystemExit(f"error: unknown rows {sorted(unknown)} (rows: {', '.join(ROWS)})")
    workload = json.loads(WORKLOAD.read_text())
    requests, tools = requests_of(workload, args.limit), workload["tools"]
    llm = LLM(args.model, threads=args.threads)
    llm.engine.grammar_vocab()  # built once per tokenizer, before any timing
    draft = args.draft or llm.model_path
    specs = {"ar": None, "plain": None, "draft": f"draft:{draft}", "draft-model": f"draft:{draft},lookup=off"}
    specs["ngram"] = "ngram"
    results: dict[str, dict] = {}
    for row in rows:
        print(f"{LABELS[row]} ...", file=sys.stderr)
        if row == "llama-server":
            peer = LlamaServerPeer("llama-server", args.llama_bin, llm.model_path, args.threads)
            with peer.serving(1, 4096) as url:
                results[row] = run_requests(url, requests, tools, None, speclm=False)
            continue
        served = llm if specs[row] is None else llm.with_spec(specs[row], args.k, True)
        lengths = None
        if row == "plain":
            if "ar" not in results:
                raise SystemExit("error: the plain row needs the ar row before it (it makes as many tokens)")
            lengths = [r["tokens"] for r in results["ar"]["requests"]]
        app = build_app(served, CacheConfig(), ServerConfig(model_name="bench"))
        results[row] = serve_while(app, lambda url, lengths=lengths: run_requests(url, requests, tools, lengths, True))
    ar_spt = None
    if "ar" in results:
        ar = results["ar"]["requests"]
        ar_spt = sum(r["seconds"] for r in ar) / sum(r["tokens"] for r in ar)
    if "plain" in results:
        plain = results["plain"]["requests"]
        ar_spt = sum(r["seconds"] for r in plain) / sum(r["tokens"] for r in plain)  # a target token, no grammar
    for result in results.values():
        for kind in ("json", "tools", "all"):
            result[kind] = summary([r for r in result["requests"] if kind == "all" or r["kind"] == kind], ar_spt)
    if "ar" in results:  # greedy constrained speculation must write what constrained AR writes
        reference = [_without_ids(r["output"]) for r in results["ar"]["requests"]]
        for name in ("draft", "draft-model", "ngram"):
            if name in results:
                results[name]["differs_from_ar"] = sum(
                    _without_ids(r["output"]) != o for r, o in zip(results[name]["requests"], reference)
                )
    command = "python benchmarks/structured_pair/structured_pair.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    report = {
        "command": command,
        "machine": machine_info(),
        "model": llm.model_path,
        "draft": draft,
        "threads": args.threads,
        "results": results,
    }
    table = markdown(report)
    print(table)
    if args.out:
        with open(f"{args.out}.json", "w") as f:
            json.dump(report, f, indent=1)
        with open(f"{args.out}.md", "w") as f:
            f.write(table)
    return 0


def markdown(report: dict) -> str:
    from speclm.bench.report import header_lines

    results = report["results"]
    title = f"Structured outputs and tool calls through the servers: {os.path.basename(report['model'])}"
    lines = header_lines(title, report["command"], report["machine"], threads=report["threads"])
    lines += [
        f"Draft: {os.path.basename(report['draft'])}. Greedy, one request at a time; each request is sent first with "
        "max_tokens 1 (TTFT: the cold prompt) and then timed in full with its prompt cached in the server, so "
        "tokens/s is decoding. Valid: finish_reason stop (tool_calls for tools) and the output valid against its "
        "schema (the called function's parameters). Forced: tokens the grammar forced, proposed as free drafts. "
        "Grammar µs/token: speclm's mask and matcher work (masks, advancing, rollback, forced tokens, draft checks, "
        "masking the logits) per generated token, from /metrics; its share is of a target token's time (the "
        "unconstrained row's seconds per token). llama-server does not report these.",
        "",
    ]
    base = {
        kind: results.get("llama-server", {}).get(kind, {}).get("tokens_per_s") for kind in ("json", "tools", "all")
    }
    for kind, heading in (("json", "JSON extraction"), ("tools", "Tool calls (tool_choice required)"), ("all", "Both")):
        lines += [
            f"## {heading}",
            "",
            "| row | requests | tokens | tokens/s | vs llama-server | tau | forced | valid | grammar µs/token | "
            "grammar / target token | TTFT mean (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row, result in results.items():
            s = result[kind]
            vs = f"{s['tokens_per_s'] / base[kind]:.2f}x" if base[kind] else "-"
            valid = "-" if row == "plain" else f"{100 * s['valid'] / s['requests']:.0f}%"
            lines.append(
                f"| {LABELS[row]} | {s['requests']} | {s['tokens']} | {s['tokens_per_s']:.1f} | {vs} | "
                f"{_fmt(s.get('tau'), '.2f')} | {_fmt(s.get('forced_share'), '.0%')} | {valid} | "
                f"{_fmt(s.get('grammar_us_per_token'), '.0f')} | "
                f"{_fmt(s.get('grammar_share_of_target_token'), '.1%')} | {s['ttft_mean']:.2f} |"
            )
        lines.append("")
    for name in ("draft", "draft-model", "ngram"):
        if "differs_from_ar" in results.get(name, {}):
            lines.append(
                f"- {LABELS[name]}: outputs differing from constrained AR's: {results[name]['differs_from_ar']}"
            )
    bad = [(row, r["name"], r["error"]) for row, result in results.items() for r in result["requests"] if r["error"]]
    lines += [f"- invalid: {row} {name}: {error}" for row, name, error in bad]
    return "\n".join(lines) + "\n"


def _without_ids(output):
    """An output to compare: tool calls without their ids (each response draws its own)."""
    if isinstance(output, list):
        return [{k: v for k, v in call.items() if k != "id"} for call in output]
    return output


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    raise SystemExit(main())
