"""Structured outputs through the server (issue 34): response_format json_object / json_schema and vLLM's
structured_outputs / guided_* on both endpoints, 400s naming the field for bad constraints (before any
model work), and "n": 1.0 accepted."""

import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow

BOOK = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}
ASK = [{"role": "user", "content": "Give me a famous book as JSON with title and year."}]


def test_json_schema_and_json_object_on_chat(default_server):
    _, client = default_server
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "book", "schema": BOOK, "strict": True}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), BOOK)
    stream = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=60, temperature=0, stream=True, response_format={"type": "json_object"}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert isinstance(json.loads(text), dict)


def test_metrics_count_constrained_tokens_and_grammar_time(default_server):
    import httpx

    url, client = default_server

    def metric(name: str) -> float:
        text = httpx.get(f"{url}/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    before = {m: metric(m) for m in ("speclm_grammar_tokens_total", "speclm_grammar_seconds_total")}
    steps = metric("speclm_decode_steps_total")
    r = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=30, temperature=0, response_format={"type": "json_object"}
    )
    assert metric("speclm_grammar_tokens_total") - before["speclm_grammar_tokens_total"] == r.usage.completion_tokens
    assert metric("speclm_grammar_seconds_total") > before["speclm_grammar_seconds_total"]
    assert metric("speclm_decode_steps_total") > steps


def test_vllm_extensions_on_completions(default_server):
    _, client = default_server
    r = client.completions.create(
        model="m",
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        extra_body={"structured_outputs": {"choice": ["Paris", "Lyon", "Nice"]}},
    )
    assert r.choices[0].text in ("Paris", "Lyon", "Nice") and r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model="m", prompt="The year was", max_tokens=8, temperature=0, extra_body={"guided_regex": r" [0-9]{4}"}
    )
    assert r.choices[0].finish_reason == "stop" and len(r.choices[0].text) == 5 and r.choices[0].text[1:].isdigit()
    r = client.completions.create(
        model="m",
        prompt="Say yes or no:",
        max_tokens=8,
        temperature=0,
        extra_body={"guided_grammar": 'start: " yes" | " no"'},
    )
    assert r.choices[0].text in (" yes", " no")


def test_bad_constraints_are_400s_naming_the_field(default_server):
    import httpx

    url, _ = default_server
    cases = [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ]
    for extra, param in cases:
        for path, body in (
            ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4}),
            ("/v1/completions", {"prompt": "x", "max_tokens": 4}),
        ):
            r = httpx.post(url + path, json={**body, **extra}, timeout=60)
            assert r.status_code == 400, (extra, r.text)
            assert r.json()["error"]["param"] == param, r.json()


def test_n_as_a_float_integer_and_completions_default_max_tokens(default_server):
    import httpx

    url, _ = default_server
    r = httpx.post(url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, "n": 1.0}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(
        url + "/v1/completions", json={"prompt": "Once", "n": 1.0, "temperature": 0, "ignore_eos": True}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    r = httpx.post(url + "/v1/completions", json={"prompt": "Once", "n": 1.5}, timeout=60)
    assert r.status_code == 400


def test_logprobs_on_both_endpoints_streaming_included(default_server, default_llm):
    from speclm import SamplingParams

    _, client = default_server
    offline = default_llm.chat(ASK, SamplingParams(max_tokens=6, logprobs=3))
    r = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == len(offline.token_ids) and all(len(c.top_logprobs) == 3 for c in content)
    for c, lp in zip(content, offline.logprobs):
        assert c.logprob == pytest.approx(lp.logprob, abs=1e-4) and c.top_logprobs[0].token == c.token
    stream = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [
        c for chunk in stream if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content
    ]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-4)
    r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 5
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    # under a grammar: only allowed tokens are listed
    r = client.completions.create(
        model="m",
        prompt="The capital of France is",
        max_tokens=5,
        temperature=0,
        logprobs=5,
        extra_body={"structured_outputs": {"choice": [" Paris", " Lyon"]}},
    )
    assert r.choices[0].text in (" Paris", " Lyon")
    first = r.choices[0].logprobs.top_logprobs[0]
    assert set(first) <= {" Paris", " Lyon", " P", " Ly", " Pa", " L", " Par", " Lyo"} or len(first) <= 5


def test_logprobs_spell_out_special_tokens(default_server):
    """A special token's text is its own in logprobs (skipped, every one would be the same empty key and a
    completion's top_logprobs would lose all but one of them)."""
    _, client = default_server
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHi! How can I help you today?"
    r = client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0, logprobs=5)
    top = r.choices[0].logprobs.top_logprobs[0]
    assert len(top) == 5 and "<|im_end|>" in top and "" not in top
    assert r.choices[0].logprobs.tokens[0] in top
