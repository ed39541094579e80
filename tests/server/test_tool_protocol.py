"""Chat messages with tools, checked as OpenAI checks them (pydantic shape, then the cross-field rules)."""

import pytest
from pydantic import ValidationError

from speclm.server.tool_protocol import ToolChatFields, ToolRequestError, check_tool_request
from speclm.structured.grammar import ConstraintError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Lyon?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]},
    {"role": "assistant", "content": "It is 21 C."},
    {"role": "user", "content": "Thanks"},
]


def request(**fields):
    return ToolChatFields.model_validate({"messages": TWO_TURNS, "tools": [WEATHER], **fields})


@pytest.mark.parametrize(
    "messages, where",
    [
        ([{"role": "tool"}], "content"),  # the example: no content, no tool_call_id
        ([{"role": "tool", "content": "21 C"}], "tool_call_id"),
        ([{"role": "tool", "tool_call_id": "call_1"}], "content"),
        ([{"role": "assistant"}], "content or tool_calls"),
        ([{"role": "user"}], "content"),
        ([{"role": "robot", "content": "hi"}], "role"),
        (
            [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f"}}]}],
            "arguments",
        ),
        ([], "at least 1"),
    ],
)
def test_malformed_messages_are_refused(messages, where):
    with pytest.raises(ValidationError) as info:
        ToolChatFields.model_validate({"messages": messages})
    assert where in str(info.value)


def test_tool_fields_are_checked():
    for bad in [
        {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        {"tool_choice": "sometimes"},
        {"tool_choice": {"type": "function"}},
        {"parallel_tool_calls": "yes"},
    ]:
        with pytest.raises(ValidationError):
            request(**bad)


def test_a_two_turn_tool_conversation_passes():
    req = request()
    check_tool_request(req)
    assert req.resolved_tool_choice() == "auto"
    assert req.message_dicts()[3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": [{"type": "text", "text": "21 C"}],
    }
    assert req.tool_dicts()[0]["function"]["name"] == "get_weather"
    named = request(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.resolved_tool_choice() == {"type": "function", "function": {"name": "get_weather"}}
    assert (
        ToolChatFields.model_validate({"messages": [{"role": "user", "content": "hi"}]}).resolved_tool_choice()
        == "none"
    )


@pytest.mark.parametrize(
    "change, param, words",
    [
        ({"tools": None, "tool_choice": "auto"}, "tool_choice", "only allowed when tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name", "nope"),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name", "duplicate"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]},
            "messages.0.tool_call_id",
            "preceding",
        ),
        (
            {"messages": TWO_TURNS[:3] + [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "messages.3.tool_call_id",
            "call_9",
        ),
        ({"messages": TWO_TURNS[:3] + TWO_TURNS[4:]}, "messages.3", "missing: call_1"),
        ({"messages": TWO_TURNS[:3]}, "messages.3", "missing: call_1"),
        (
            {"messages": TWO_TURNS[:2] + [{"role": "assistant", "tool_calls": [CALL, CALL]}]},
            "messages.2.tool_calls",
            "unique",
        ),
    ],
)
def test_cross_field_rules(change, param, words):
    with pytest.raises(ToolRequestError) as info:
        check_tool_request(request(**change))
    assert info.value.param == param and words in info.value.message


def test_a_parameter_schema_that_does_not_compile_names_the_tool():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    with pytest.raises(ConstraintError) as info:
        check_tool_request(request(tools=[WEATHER, bad]))
    assert info.value.param == "tools.1.function.parameters"
