"""Tools in chat completions (issue 34), on the default model (its template has no tool support: the
generic JSON tool format, always constrained): a two-turn conversation with the openai client, tool
choice required so the call is certain, streamed calls, and OpenAI's message checks."""

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What is the weather in Lyon?"}]


def test_two_turn_tool_conversation_with_the_openai_client(default_server):
    _, client = default_server
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city"}
    messages = ASK + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "clear"})},
    ]
    r = client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER, TIME], tool_choice="none", max_tokens=30, temperature=0
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_named_tool_choice_streams_the_call_as_openai_does(default_server):
    _, client = default_server
    stream = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_messages_are_checked_as_openai_checks_them(default_server):
    url, _ = default_server
    cases = [
        ({"messages": [{"role": "tool"}]}, "messages.0"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "call_1"}]}, "messages.0.tool_call_id"),
        ({"messages": ASK, "tool_choice": "required"}, "tool_choice"),
        (
            {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"messages": ASK, "tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
    ]
    for body, param in cases:
        r = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"].startswith(param), r.json()
