"""Fuzzing a running speclm server with schemathesis (cases generated from its own /openapi.json, valid
and invalid) plus hand-made hostile requests: statuses and every answer that breaks the rules (a 5xx, a
body outside OpenAI's error envelope, a response that does not match the document). Shared by
tests/server/test_hostile_clients.py (a bounded run) and benchmarks/fuzz/fuzz.py (the long one), with the
fuzz benchmarks' target server and report (benchmarks/structured_fuzz/fuzz.py's too)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

# Requests a fuzzer does not think of (each once found an engine-killing or 500 answer).
HOSTILE_BODIES = [
    ("/v1/completions", {"prompt": []}),
    ("/v1/completions", {"prompt": "a", "temperature": 1e-38}),
    ("/v1/completions", {"prompt": "a", "temperature": 5e-324}),
    ("/v1/completions", {"prompt": "a", "top_p": 5e-324}),
    ("/v1/completions", {"prompt": "a", "top_p": 1e-46}),
    ("/v1/completions", {"prompt": "a", "seed": 2**64}),
    ("/v1/completions", {"prompt": "a", "seed": 2**64, "stream": True}),
    ("/v1/completions", {"prompt": "a\ud800"}),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}),
    ("/v1/completions", {"prompt": "a", "n": 1.0}),
    ("/v1/completions", {"prompt": [False]}),
    ("/v1/completions", {"prompt": "a", "logprobs": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]}),
]


def _problem(status: int, content_type: str, text: str) -> str | None:
    """Why an answer breaks the rules, or None."""
    if status >= 500 and status != 503:
        return f"{status}: {text[:200]}"
    if status >= 400:
        try:
            error = json.loads(text)["error"]
            assert isinstance(error["message"], str) and "type" in error
        except (ValueError, KeyError, TypeError, AssertionError):
            return f"{status} outside the OpenAI error envelope: {text[:200]}"
    return None


def fuzz_server(url: str, examples: int = 100, seed: int = 0) -> dict:
    """Run `examples` positive and `examples` negative cases per generation endpoint (and positive
    ones for /v1/models), plus HOSTILE_BODIES;
    returns {"cases", "statuses", "failures", "seconds"}."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    statuses: dict[str, int] = {}
    failures: list[str] = []
    t0 = time.perf_counter()

    def record(method: str, path: str, body, response) -> None:
        statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
        problem = _problem(response.status_code, response.headers.get("content-type", ""), response.text)
        if problem:
            failures.append(f"{method} {path} {json.dumps(body)[:200]}: {problem}")

    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
        method = "GET" if path == "/v1/models" else "POST"
        operation = schema[path][method]
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if method == "POST" else [])
        for mode in modes:  # (a GET without parameters has no invalid form)
            checks = [schemathesis.checks.not_a_server_error]
            if mode == GenerationMode.POSITIVE:  # valid requests: the answer must match the document too
                checks += [
                    schemathesis.checks.status_code_conformance,
                    schemathesis.checks.content_type_conformance,
                    schemathesis.checks.response_schema_conformance,
                ]

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=seed == 0,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate],
            )
            def run(case) -> None:
                try:
                    response = case.call(base_url=url, timeout=120)
                except requests.exceptions.Timeout:  # a long generation, not a broken rule: counted apart
                    statuses["client timeout"] = statuses.get("client timeout", 0) + 1
                    return
                record(method, path, case.body, response)
                try:
                    case.validate_response(response, checks=checks)
                except Exception as e:  # schemathesis reports a rule broken; keep going, count it
                    failures.append(
                        f"{method} {path} {json.dumps(case.body, default=str)[:200]}: "
                        f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                    )

            run()
    with httpx.Client(timeout=60) as client:
        for path, body in HOSTILE_BODIES:
            response = client.post(
                f"{url}{path}", content=json.dumps(body).encode(), headers={"content-type": "application/json"}
            )
            record("POST", path, body, response)
    alive = httpx.get(f"{url}/health", timeout=10).status_code == 200
    if not alive:
        failures.append("/health is not ok after the run: the engine died")
    return {
        "cases": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
        "failures": failures,
        "engine_alive": alive,
        "seconds": round(time.perf_counter() - t0, 1),
    }


@contextmanager
def fuzz_target(llm, cache) -> Iterator[str]:
    """A server over `llm` with an engine of its own over `cache` (CacheConfig), on loopback; yields its URL
    (the fuzz benchmarks' target when they start one)."""
    from speclm.bench.serve_bench import serve_in_thread
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig

    with serve_in_thread(build_app(llm, cache, ServerConfig(model_name="fuzz"))) as url:
        yield url


def write_fuzz_report(
    script: str, argv: list[str] | None, report: dict, out: str | None, markdown: Callable[[dict], str]
) -> dict:
    """`report` with the command that made it and the machine: printed (less the machine) and, with `out`,
    written to OUT.json and OUT.md (`markdown(report)`: the page)."""
    from speclm.bench.machine import machine_info

    command = f"python {script} " + " ".join(sys.argv[1:] if argv is None else argv)
    report = {"command": command, "machine": machine_info(), **report}
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    if out:
        with open(f"{out}.json", "w") as f:
            json.dump(report, f, indent=1)
        with open(f"{out}.md", "w") as f:
            f.write(markdown(report))
    return report
