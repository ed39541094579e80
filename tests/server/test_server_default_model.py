"""The server on the default SmolLM2 model: openai client chat and completions equal the offline engine."""

import openai
import pytest

from speclm import SamplingParams
from speclm.config import CacheConfig
from tests.server.conftest import running_server

pytestmark = pytest.mark.slow


def test_openai_client_chat_and_completions_match_offline(default_llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    offline_chat = default_llm.chat(messages, SamplingParams(max_tokens=8))
    expected_chat = offline_chat.text
    expected_completion = default_llm.generate("The three primary colors are", SamplingParams(max_tokens=8))[0].text
    with running_server(default_llm, CacheConfig(kv_cache_mb=64)) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=60, max_retries=0)
        r = client.chat.completions.create(model="test-model", messages=messages, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == expected_chat and r.choices[0].message.role == "assistant"
        assert r.usage.completion_tokens == len(offline_chat.token_ids)
        assert r.choices[0].finish_reason == offline_chat.finish_reason
        stream = client.chat.completions.create(
            model="test-model", messages=messages, max_tokens=8, temperature=0, stream=True
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected_chat
        assert chunks[-1].choices[0].finish_reason == offline_chat.finish_reason
        r = client.completions.create(
            model="test-model", prompt="The three primary colors are", max_tokens=8, temperature=0
        )
        assert r.choices[0].text == expected_completion
        # content as a list of text parts, and the usage chunk of stream_options
        parts = [
            {
                "role": "user",
                "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}],
            }
        ]
        stream = client.chat.completions.create(
            model="test-model",
            messages=parts,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_chat
        assert chunks[-1].usage.completion_tokens == len(offline_chat.token_ids) and not chunks[-1].choices
