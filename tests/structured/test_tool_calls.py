"""Tool calls parsed from replies (Hermes tags and the generic JSON format) and streamed: the deltas of
a reply, however it is split, add up to the parsed result."""

import itertools
import json
import random

import pytest

from speclm.structured.tool_calls import ToolCallStream, parse_tool_calls
from speclm.structured.tools import GENERIC, HERMES


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def call(i, name, arguments):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


HERMES_CASES = [
    ("Just text, <b>no</b> calls.", "Just text, <b>no</b> calls.", []),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>',
        None,
        [call(0, "get_weather", {"city": "Lyon"})],
    ),
    (
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>\n',
        "Let me check.\n\n\n",
        [call(0, "a", {"x": 1}), call(1, "b", {})],
    ),
    ("<tool_call>\nnot json\n</tool_call> tail", "<tool_call>\nnot json\n</tool_call> tail", []),
    ('<tool_call>\n{"name": "a", "arguments": {"x": "é"}}', None, [call(0, "a", {"x": "é"})]),  # unclosed at EOS
    ('<tool_call>\n{"name": "a", "arguments": {"x": ', '<tool_call>\n{"name": "a", "arguments": {"x": ', []),
    ("ends with <tool_", "ends with <tool_", []),
]


@pytest.mark.parametrize("text, content, calls", HERMES_CASES)
def test_parse_hermes(text, content, calls):
    parsed = parse_tool_calls(text, HERMES, ids())
    assert parsed.content == content
    assert [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in parsed.tool_calls
    ] == [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in calls]
    for c in parsed.tool_calls:
        assert isinstance(c["function"]["arguments"], str)


@pytest.mark.parametrize(
    "text, content, calls",
    [
        ('{"response": "It is sunny."}', "It is sunny.", []),
        ('{"tool_call": {"name": "a", "arguments": {"x": 1}}}', None, [call(0, "a", {"x": 1})]),
        (
            '{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]}',
            None,
            [call(0, "a", {}), call(1, "b", {"y": [1]})],
        ),
        ("plain text", "plain text", []),
        ('{"tool_calls": []}', '{"tool_calls": []}', []),
        ('{"tool_call": {"arguments": {}}}', '{"tool_call": {"arguments": {}}}', []),
    ],
)
def test_parse_generic(text, content, calls):
    parsed = parse_tool_calls(text, GENERIC, ids())
    assert parsed.content == content
    assert parsed.tool_calls == calls


def collect(deltas):
    """A stream's deltas folded as an OpenAI client folds them."""
    content, calls = "", {}
    for delta in deltas:
        assert set(delta) <= {"content", "tool_calls"}
        content += delta.get("content", "")
        for part in delta.get("tool_calls", []):
            slot = calls.setdefault(
                part["index"], {"id": None, "type": None, "function": {"name": "", "arguments": ""}}
            )
            slot["id"] = part.get("id", slot["id"])
            slot["type"] = part.get("type", slot["type"])
            slot["function"]["name"] += part["function"].get("name", "")
            slot["function"]["arguments"] += part["function"].get("arguments", "")
    return (content or None), [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize(
    "fmt, text",
    [(HERMES, t) for t, _, _ in HERMES_CASES]
    + [
        (GENERIC, '{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]}'),
        (GENERIC, '{"response": "hi"}'),
    ],
)
def test_stream_deltas_add_up_to_the_parsed_reply(fmt, text):
    expected = parse_tool_calls(text, fmt, ids())
    rng = random.Random(0)
    splits = [[text[i : i + 1] for i in range(len(text))], [text]]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        splits.append([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])])
    for pieces in splits:
        stream = ToolCallStream(fmt, ids())
        deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
        assert collect(deltas) == (expected.content, expected.tool_calls), pieces


def test_stream_sends_content_before_the_call_closes():
    stream = ToolCallStream(HERMES, ids())
    assert stream.feed("Checking") == [{"content": "Checking"}]
    assert stream.feed(" now <tool") == [{"content": " now "}]  # '<tool' may open a tag: held back
    assert stream.feed('_call>\n{"name": "a", "arguments": {}}') == []
    assert stream.feed("\n</tool_call>") == [
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {"name": "a", "arguments": "{}"}}]}
    ]
    assert stream.finish() == []
