"""Hostile clients against a live server (stories260K, loopback): each crasher found by fuzzing gets an
OpenAI-schema answer and the engine keeps serving; a failing step fails only its requests; a dead
engine loop is reported; abandoned requests stop; limits answer 413/429; a bounded schemathesis run."""

import json
import threading
import time

import httpx
import pytest

from speclm import SamplingParams
from tests.server.conftest import running_server, wait_until

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# (endpoint, body, expected status, expected error param)
CRASHERS = [
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "a", "top_p": 5e-324}, 400, "top_p"),  # 0 in float32
    (COMPLETIONS, {"prompt": "a", "top_p": 1e-46}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "a", "seed": 2**64}, 400, "seed"),
    (COMPLETIONS, {"prompt": "a", "seed": 2**64, "stream": True}, 400, "seed"),
    (COMPLETIONS, {"prompt": "a\ud800"}, 400, "prompt"),  # a lone surrogate
    (CHAT, {"messages": [{"role": "user", "content": "\udfff"}]}, 400, "messages.0.content"),
    (COMPLETIONS, {"prompt": "a", "stream": "yes"}, 400, "stream"),
    (COMPLETIONS, {"prompt": "a", "n": 1.5}, 400, "n"),  # (1.0 is an integer in JSON Schema: accepted)
    (COMPLETIONS, {"prompt": [False]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "a", "temperature": float("nan")}, 400, "temperature"),  # Python's JSON reads NaN
    (COMPLETIONS, {"prompt": "a", "logprobs": 6}, 400, "logprobs"),  # OpenAI's limit is 5
    (COMPLETIONS, {"prompt": "a", "echo": True}, 400, "echo"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 1}, 400, "top_logprobs"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    (COMPLETIONS, {"prompt": "a", "response_format": {"type": "xml"}}, 400, "response_format.type"),
    (COMPLETIONS, {"prompt": "a", "stop": ["x"] * 17}, 400, "stop"),
]


def post(url, path, body, timeout=30):
    return httpx.post(
        f"{url}{path}", content=json.dumps(body).encode(), timeout=timeout, headers={"content-type": "application/json"}
    )


def engine_idle(app) -> bool:
    e = app.state.engine.engine
    return not e.has_unfinished() and e.block_manager.num_used_blocks == 0


def greedy_text(llm, prompt, max_tokens):
    return llm.generate(prompt, SamplingParams(max_tokens=max_tokens))[0].text


@pytest.fixture(scope="module")
def server(stories_llm):
    with running_server(stories_llm) as (url, app):
        yield url, app


@pytest.mark.parametrize("path,body,status,param", CRASHERS)
def test_crashers_get_openai_errors_and_the_engine_keeps_serving(server, stories_llm, path, body, status, param):
    url, app = server
    r = post(url, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param
    r = post(url, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy_text(stories_llm, "Once upon a time", 8)
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    wait_until(lambda: engine_idle(app))


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 5e-324])
def test_vanishing_temperatures_decode_greedily(server, stories_llm, temperature):
    url, _ = server
    r = post(url, COMPLETIONS, {"prompt": "Tom had a dog", "max_tokens": 12, "temperature": temperature, "seed": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy_text(stories_llm, "Tom had a dog", 12)


def test_extreme_but_valid_values_are_served(server, stories_llm):
    """Values at the edges of their ranges get a complete OpenAI completion (max_tokens past the context
    stops at the context), and the engine is left idle and serving."""
    url, app = server
    context = app.state.engine.limits.max_total_tokens
    prompt_tokens = len(stories_llm.encode("a"))
    for body, most in (
        ({"prompt": "a", "seed": 2**64 - 1, "temperature": 2, "max_tokens": 3}, 3),
        ({"prompt": "a", "seed": -(2**63), "top_p": 1e-30, "max_tokens": 3}, 3),
        ({"prompt": "a", "max_tokens": 10**12, "top_k": 10**12, "stop": "x" * 512, "ignore_eos": True}, None),
    ):
        r = post(url, COMPLETIONS, body, timeout=120)
        assert r.status_code == 200, (body, r.text)
        out = r.json()
        assert out["object"] == "text_completion" and len(out["choices"]) == 1
        choice, usage = out["choices"][0], out["usage"]
        assert (
            choice["index"] == 0 and isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length")
        )
        assert usage["prompt_tokens"] == prompt_tokens
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        if most is not None:
            assert 1 <= usage["completion_tokens"] <= most
        else:  # no stop string in sight and EOS ignored: it runs to the end of the context
            assert choice["finish_reason"] == "length" and usage["total_tokens"] == context
    wait_until(lambda: engine_idle(app))
    r = post(url, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert r.json()["choices"][0]["text"] == greedy_text(stories_llm, "Once upon a time", 8)


def slowed(app, seconds_per_step: float, fail_at: int | None = None):
    """Make every engine step take at least `seconds_per_step`; with fail_at, forward pass number
    fail_at raises. Returns a function that undoes it."""
    runner = app.state.engine.engine.runner
    original, calls = runner.forward, [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        if calls[0] == fail_at:
            raise RuntimeError("injected failure")
        time.sleep(seconds_per_step)
        return original(*args, **kwargs)

    runner.forward = forward
    return lambda: setattr(runner, "forward", original)


def test_a_failing_step_fails_only_its_requests(stories_llm):
    with running_server(stories_llm) as (url, app):
        restore = slowed(app, 0.0, fail_at=3)
        r = post(url, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        restore()
        restore = slowed(app, 0.0, fail_at=4)  # mid-stream: an error event, then [DONE]
        with httpx.stream(
            "POST", f"{url}{COMPLETIONS}", json={"prompt": "Tom", "max_tokens": 30, "stream": True}, timeout=30
        ) as response:
            assert response.status_code == 200
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        restore()
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "server_error"
        assert any("choices" in json.loads(e) for e in events[:-2])
        wait_until(lambda: engine_idle(app))
        r = post(url, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy_text(
            stories_llm, "Once upon a time", 8
        )
        metrics = httpx.get(f"{url}/metrics").text
        assert "speclm_num_requests_running 0.0" in metrics and "speclm_kv_blocks_used 0.0" in metrics


class LoopBroken(BaseException):
    pass


def test_a_dead_engine_loop_fails_health_and_requests(stories_llm):
    died = []
    with running_server(stories_llm, on_fatal=died.append) as (url, app):
        engine = app.state.engine

        def broken_dispatch(outputs, seconds):
            raise LoopBroken("the loop broke")

        engine._dispatch = broken_dispatch
        r = post(url, COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 20})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert len(died) == 1 and isinstance(died[0], LoopBroken)
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json() == {"status": "unavailable"}  # no exception text
        r = post(url, COMPLETIONS, {"prompt": [1, 2, 3], "stream": True})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"


def test_abandoned_non_streaming_request_stops_within_a_second(stories_llm):
    with running_server(stories_llm) as (url, app):
        restore = slowed(app, 0.02)
        with pytest.raises(httpx.ReadTimeout):
            post(url, COMPLETIONS, {"prompt": "Once", "max_tokens": 400, "ignore_eos": True}, timeout=0.5)
        t0 = time.monotonic()
        wait_until(lambda: engine_idle(app), timeout=5)
        assert time.monotonic() - t0 < 1.0
        restore()


def test_limits_answer_413_and_429(stories_llm):
    with running_server(stories_llm, max_body_bytes=2000, max_concurrent_requests=1) as (url, app):
        r = post(url, COMPLETIONS, {"prompt": "a" * 3000})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        chunks = (b'{"prompt": "' + b"a" * 1000, b"a" * 1000, b'a"}')  # no content-length: counted as it arrives
        r = httpx.post(f"{url}{COMPLETIONS}", content=iter(chunks), headers={"content-type": "application/json"})
        assert r.status_code == 413
        restore = slowed(app, 0.02)
        busy = threading.Thread(
            target=post, args=(url, COMPLETIONS, {"prompt": "a", "max_tokens": 60, "ignore_eos": True})
        )
        busy.start()
        wait_until(lambda: app.state.service.in_flight == 1)
        r = post(url, COMPLETIONS, {"prompt": "a", "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] and r.json()["error"]["code"] == "rate_limit_exceeded"
        busy.join()
        restore()
        assert post(url, COMPLETIONS, {"prompt": "a", "max_tokens": 2}).status_code == 200


def test_a_huge_prompt_does_not_block_other_endpoints(server, monkeypatch):
    url, app = server
    tokenizer = app.state.service.tokenizer
    too_long = [1] * (app.state.engine.engine.max_total_tokens + 1)

    def slow_encode(text):  # 2 s of tokenizing: on the event loop it would hold up every health check
        time.sleep(2.0)
        return too_long

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    body = {"prompt": "Once upon a time, there was a girl. " * 50_000}  # ~1.8 MB
    result = {}
    sender = threading.Thread(target=lambda: result.update(r=post(url, COMPLETIONS, body, timeout=60)))
    sender.start()
    latencies = []
    while sender.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.05)
    assert result["r"].status_code == 400 and result["r"].json()["error"]["code"] == "context_length_exceeded"
    assert len(latencies) >= 5 and max(latencies) < 0.5, latencies


def test_openapi_document_promises_what_the_server_answers(server):
    url, _ = server
    doc = httpx.get(f"{url}/openapi.json").json()
    assert "422" not in json.dumps(doc["paths"])
    for path in (COMPLETIONS, CHAT):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "401", "413", "429", "500", "503"} <= set(responses)
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


def test_schemathesis_fuzzing_finds_no_server_error(server):
    """A bounded run (positive and negative cases per operation); `python benchmarks/fuzz/fuzz.py` runs the long one."""
    from tests.fuzz import fuzz_server

    url, app = server
    report = fuzz_server(url, examples=40, seed=0)
    assert report["cases"] >= 150 and report["failures"] == [], report["failures"][:3]
    assert report["statuses"].get("200", 0) > 0 and report["statuses"].get("400", 0) > 0
    assert app.state.engine.alive
    wait_until(lambda: engine_idle(app))
