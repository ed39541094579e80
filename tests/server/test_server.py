"""The HTTP server on stories260K: openai client parity with the offline engine, 32 concurrent streams,
prefix cache, disconnects, preemption, OpenAI-style 4xx errors, metrics."""

import asyncio
import re
import time

import httpx
import openai
import pytest

from speclm import SamplingParams
from speclm.config import CacheConfig
from tests.server.conftest import running_server, wait_until

PROMPTS = [
    "Once upon a time",
    "Tom had a dog",
    "The sun was hot and the",
    "Lily and Ben went to the park. They saw a big",
    "One day, a little bird",
    "Sam liked to eat",
]


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def engine_idle(app) -> bool:
    e = app.state.engine.engine
    return not e.has_unfinished() and e.block_manager.num_used_blocks == 0


@pytest.fixture(scope="module")
def server(stories_llm):
    with running_server(stories_llm) as (url, app):
        yield url, app


def offline(llm, prompt, max_tokens, **kw):
    return llm.generate(prompt, SamplingParams(max_tokens=max_tokens, **kw))[0]


def test_openai_client_completions_match_offline_engine(server, stories_llm):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30, max_retries=0)
    assert [m.id for m in client.models.list()] == ["test-model"]
    for prompt, max_tokens in (("Once upon a time", 30), ("", 12)):
        expected = offline(stories_llm, prompt, max_tokens)
        r = client.completions.create(model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0)
        assert r.choices[0].text == expected.text and r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == max_tokens and r.usage.prompt_tokens == len(stories_llm.encode(prompt))
        stream = client.completions.create(
            model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks) == expected.text
        assert chunks[-1].choices[0].finish_reason == "length" and len(chunks) > 2
    # token-id prompts, stop strings, n > 1 with seeds (sample i uses seed + i)
    ids = stories_llm.encode("Tom had a dog")
    r = client.completions.create(model="test-model", prompt=ids, max_tokens=40, temperature=0, stop=["."])
    assert r.choices[0].text == offline(stories_llm, ids, 40, stop=["."]).text and r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model="test-model", prompt="Tom had a dog", max_tokens=15, temperature=0.8, top_p=0.9, seed=11, n=2
    )
    for choice in r.choices:
        assert (
            choice.text
            == offline(stories_llm, "Tom had a dog", 15, temperature=0.8, top_p=0.9, seed=11 + choice.index).text
        )


def test_32_concurrent_streams_get_their_solo_outputs(server, stories_llm):
    url, app = server
    jobs = [(PROMPTS[i % len(PROMPTS)], 8 + (i * 13) % 90) for i in range(32)]
    expected = [offline(stories_llm, p, m).text for p, m in jobs]

    async def one(client, prompt, max_tokens):
        stream = await client.completions.create(
            model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream])

    async def main():
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", timeout=60, max_retries=0) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, p, m) for p, m in jobs)), 120)

    assert asyncio.run(main()) == expected
    wait_until(lambda: engine_idle(app))
    assert metric(url, "speclm_kv_blocks_used") == 0


def test_shared_prefix_is_served_from_prefix_cache(stories_llm):
    prefix = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " * 6
    config = CacheConfig(block_size=8, max_num_batched_tokens=16)  # a long prompt takes many prefill steps

    def ttft(client, prompt):
        t0 = time.perf_counter()
        stream = client.completions.create(model="test-model", prompt=prompt, max_tokens=2, temperature=0, stream=True)
        first = next(c for c in stream if c.choices[0].text)
        elapsed = time.perf_counter() - t0
        return elapsed, first.choices[0].text + "".join(c.choices[0].text for c in stream)

    with running_server(stories_llm, config) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=30, max_retries=0)
        cold, text_a = ttft(client, prefix + "Tom")
        assert metric(url, "speclm_prefix_cache_hit_tokens") == 0
        warm, text_b = ttft(client, prefix + "Sue")
        hits = metric(url, "speclm_prefix_cache_hit_tokens")
        assert hits >= len(stories_llm.encode(prefix)) - 16
        assert 0 < metric(url, "speclm_prefix_cache_hit_rate") < 1
        assert text_b == offline(stories_llm, prefix + "Sue", 2).text
        assert warm < cold, (warm, cold)  # ~2 engine steps instead of ~20


def test_disconnect_mid_stream_frees_blocks(server):
    url, app = server
    before = metric(url, "speclm_generation_tokens_total")
    body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{url}/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert app.state.engine.engine.block_manager.num_used_blocks > 0
    wait_until(lambda: engine_idle(app))
    assert metric(url, "speclm_generation_tokens_total") - before < 400  # stopped early, not run to the end


def test_block_exhaustion_preempts_and_everyone_finishes(stories_llm):
    config = CacheConfig(num_blocks=48, block_size=4, max_num_batched_tokens=32)
    jobs = [(PROMPTS[i % len(PROMPTS)], 60 + 20 * (i % 3)) for i in range(8)]
    with running_server(stories_llm, config) as (url, app):

        async def main():
            async with httpx.AsyncClient(timeout=60) as client:
                rs = await asyncio.gather(
                    *(
                        client.post(
                            f"{url}/v1/completions",
                            json={"prompt": p, "max_tokens": m, "temperature": 0, "ignore_eos": True},
                        )
                        for p, m in jobs
                    )
                )
                return [r.json()["choices"][0]["text"] for r in rs]

        texts = asyncio.run(main())
        assert texts == [offline(stories_llm, p, m, ignore_eos=True).text for p, m in jobs]
        assert metric(url, "speclm_num_preemptions") > 0
        wait_until(lambda: engine_idle(app))


def test_bad_requests_get_openai_errors_and_server_keeps_serving(server, stories_llm):
    url, _ = server

    def post(body, **kw):
        return httpx.post(f"{url}/v1/completions", timeout=10, **({"json": body} if body is not None else kw))

    cases = [
        (post(None, content=b'{"prompt": "a",', headers={"content-type": "application/json"}), 400, None),
        (post({"prompt": "a", "temperature": -1}), 400, "temperature"),
        (post({"prompt": "a", "max_tokens": 0}), 400, "max_tokens"),
        (post({"prompt": "a", "top_p": 1.5}), 400, "top_p"),
        (post({"prompt": "a", "n": 1000}), 400, "n"),
        (post({"prompt": "a", "stop": [""]}), 400, "stop"),
        (post({"max_tokens": 3}), 400, "prompt"),
        (post({"prompt": [1, 99999]}), 400, "prompt"),
        (post({"prompt": "Once upon a time " * 200}), 400, "prompt"),
        (
            httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}),
            400,
            "messages",
        ),
        (httpx.post(f"{url}/v1/chat/completions", json={"messages": []}), 400, "messages"),
    ]
    for response, status, param in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    r = post({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == offline(stories_llm, "Once upon a time", 5).text
    # a client naming another model is served by this one, and told which
    r = post({"model": "gpt-4", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200 and r.json()["model"] == "test-model"
    assert metric(url, 'speclm_requests_total{endpoint="/v1/completions",status="400"}') >= 9


def test_api_key_required_when_set(stories_llm):
    with running_server(stories_llm, api_key="sekret") as (url, _):
        bad = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", timeout=10, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="test-model", prompt="a", max_tokens=2)
        good = openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", timeout=10, max_retries=0)
        assert good.completions.create(model="test-model", prompt="a", max_tokens=2).usage.completion_tokens == 2
        assert httpx.get(f"{url}/health").status_code == 200  # health needs no key (probes), metrics do
        assert httpx.get(f"{url}/metrics").status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            assert httpx.get(f"{url}/metrics", headers={"Authorization": f"{scheme} sekret"}).status_code == 200
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sekre"}).status_code == 401
    with running_server(stories_llm, api_key="sekret", metrics_open=True) as (url, _):
        assert httpx.get(f"{url}/metrics").status_code == 200


def test_speculative_server_is_lossless_and_reports_acceptance(stories_llm):
    llm = stories_llm.with_spec("ngram", 4)
    jobs = [(PROMPTS[i % len(PROMPTS)], 40 + 10 * i) for i in range(4)]
    with running_server(llm) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=30, max_retries=0)
        for prompt, max_tokens in jobs:
            r = client.completions.create(model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0)
            assert r.choices[0].text == offline(stories_llm, prompt, max_tokens).text
        drafted = metric(url, 'speclm_spec_drafted_tokens_total{position="0"}')
        accepted = metric(url, 'speclm_spec_accepted_tokens_total{position="0"}')
        assert drafted > 0 and 0 < accepted <= drafted
        assert metric(url, 'speclm_spec_drafted_tokens_total{position="1"}') <= drafted


@pytest.mark.parametrize("spec", ["medusa:{medusa}", "eagle:{eagle}"])  # default options: token trees
def test_head_speculation_server_returns_plain_greedy_text(stories_llm, tmp_path, spec):
    from tests.speculative.tree_proposers import write_perturbed_heads

    llm = stories_llm.with_spec(spec.format(**write_perturbed_heads(stories_llm.model.config, tmp_path)), 5)
    jobs = [(PROMPTS[i], 20 + 15 * i) for i in range(4)]
    expected = [offline(stories_llm, p, m).text for p, m in jobs]

    async def one(client, prompt, max_tokens):
        r = await client.completions.create(model="test-model", prompt=prompt, max_tokens=max_tokens, temperature=0)
        return r.choices[0].text

    async def main(url):
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", timeout=60, max_retries=0) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, p, m) for p, m in jobs)), 120)

    with running_server(llm) as (url, app):
        assert asyncio.run(main(url)) == expected
        assert metric(url, 'speclm_spec_drafted_tokens_total{position="0"}') > 0
        wait_until(lambda: engine_idle(app))
