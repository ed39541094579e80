"""The HTTP server on the GPU: 32 concurrent requests (half of them streamed) get the tokens each gets
alone from the offline engine, in half precision with CUDA graphs. The client is the standard library's
(the GPU machine has no openai or httpx to rely on); fastapi and uvicorn come from .whl there
(benchmarks/cuda/README.md) and the test skips where they are missing."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from speclm import SamplingParams
from tests.cuda.conftest import needs_cuda

pytestmark = needs_cuda

PROMPTS = [
    "Once upon a time",
    "Tom had a dog",
    "The sun was hot and the",
    "Lily and Ben went to the park. They saw a big",
    "One day, a little bird",
    "Sam liked to eat",
]


def complete(url: str, prompt: str, max_tokens: int, stream: bool) -> str:
    body = {"model": "test-model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        if not stream:
            return json.loads(response.read())["choices"][0]["text"]
        text = []
        for line in response:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
        return "".join(text)


def test_32_concurrent_server_requests_get_their_solo_outputs_on_gpu(stories_gpu):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from tests.server.conftest import running_server

    jobs = [(PROMPTS[i % len(PROMPTS)], 8 + (i * 13) % 90, i % 2 == 1) for i in range(32)]
    expected = [stories_gpu.generate(p, SamplingParams(max_tokens=m, temperature=0))[0].text for p, m, _ in jobs]
    with running_server(stories_gpu) as (url, app):
        with ThreadPoolExecutor(32) as pool:
            got = list(pool.map(lambda job: complete(url, *job), jobs))
        graphs = app.state.engine.engine.runner.decode_graphs(app.state.engine.engine.cache)
    mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert not mismatches, f"{len(mismatches)}/32 requests differ from their solo output: {mismatches}"
    assert graphs is not None and graphs.failed is None and graphs.steps > 0
