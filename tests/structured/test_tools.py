"""Tools in prompts and grammars: Qwen2.5's own template renders tools, calls and results; SmolLM2's
template (no tool support) gets the generic JSON tool prompt; the constraint of `required`, a named
function or the generic format makes a random sampler produce calls whose arguments fit the schema."""

import copy
import json
import os

import jsonschema
import pytest
import torch

from speclm.sample.masked import select_masked
from speclm.sampling_params import SamplingParams
from speclm.structured.grammar import ConstraintError
from speclm.structured.matcher import GrammarMatcher, GrammarVocab
from speclm.structured.tool_calls import parse_tool_calls
from speclm.structured.tools import GENERIC, HERMES, check_tools, render_tool_prompt, tool_constraint, tool_format
from tests.structured.qwen_template import QWEN25_TEMPLATE
from tests.structured.test_matcher import sample_constrained

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}  # no parameters
TOOLS = [WEATHER, TIME]
CONVERSATION = [
    {"role": "user", "content": "Weather in Lyon?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"},
]
PAIR_QWEN = os.path.expanduser("~/.cache/speclm/pair/qwen2.5-coder-0.5b-instruct-q5_0.gguf")


@pytest.fixture
def qwen_style(smol_tokenizer):
    """SmolLM2's tokenizer with Qwen2.5's template: HERMES format, tags written as text."""
    tokenizer = copy.copy(smol_tokenizer)
    tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


def test_tool_format(smol_tokenizer):
    assert tool_format(QWEN25_TEMPLATE) == HERMES
    assert tool_format(smol_tokenizer.chat_template) == GENERIC
    assert tool_format(None) == GENERIC
    assert tool_format("{{ '<tool_call>' }}{% for m in messages %}{{ m.content }}{% endfor %}") == GENERIC


def test_qwen_template_renders_tools_calls_and_results(qwen_style):
    prompt = render_tool_prompt(qwen_style, CONVERSATION, TOOLS, "auto", True)
    assert "# Tools" in prompt and json.dumps(WEATHER, ensure_ascii=False) in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n21 C, sunny\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    named = render_tool_prompt(
        qwen_style, CONVERSATION, TOOLS, {"type": "function", "function": {"name": "get_time"}}, True
    )
    assert '"get_time"' in named and '"get_weather", "description"' not in named
    assert "# Tools" not in render_tool_prompt(qwen_style, CONVERSATION, TOOLS, "none", True)


def test_generic_prompt_for_a_template_without_tools(smol_tokenizer):
    prompt = render_tool_prompt(smol_tokenizer, CONVERSATION, TOOLS, "auto", False)
    assert prompt.startswith("<|im_start|>system\nYou can call the following tools:\n")
    assert json.dumps(WEATHER["function"], ensure_ascii=False) in prompt
    assert '{"response": <your reply to the user>}' in prompt
    assert '<|im_start|>assistant\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Lyon"}}}' in prompt
    result = {"tool_response": {"tool_call_id": "call_1", "name": "get_weather", "content": "21 C, sunny"}}
    assert f"<|im_start|>user\n{json.dumps(result)}<|im_end|>" in prompt
    required = render_tool_prompt(smol_tokenizer, CONVERSATION, TOOLS, "required", True)
    assert '{"tool_calls": [' in required and '"response"' not in required
    with_system = [{"role": "system", "content": "Be brief."}] + CONVERSATION
    assert render_tool_prompt(smol_tokenizer, with_system, TOOLS, "auto", False).startswith(
        "<|im_start|>system\nBe brief.\n\nYou can call the following tools:"
    )


def check_calls(calls, allowed_names):
    assert calls, "no tool call parsed"
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in allowed_names
        schema = next(t for t in TOOLS if t["function"]["name"] == name)["function"].get("parameters")
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema or {"type": "object", "maxProperties": 0})


@pytest.mark.parametrize(
    "fmt, choice, parallel, names",
    [
        (GENERIC, "required", False, {"get_weather", "get_time"}),
        (GENERIC, "required", True, {"get_weather", "get_time"}),
        (GENERIC, {"type": "function", "function": {"name": "get_weather"}}, False, {"get_weather"}),
        (HERMES, "required", True, {"get_weather", "get_time"}),
        (HERMES, {"type": "function", "function": {"name": "get_weather"}}, False, {"get_weather"}),
    ],
)
def test_constrained_random_calls_parse_and_fit_the_schema(smol_tokenizer, smol_vocab, fmt, choice, parallel, names):
    constraint = tool_constraint(smol_tokenizer, fmt, TOOLS, choice, parallel)
    gen = torch.Generator().manual_seed(2)
    for _ in range(6):
        matcher = GrammarMatcher(smol_vocab, constraint)
        tokens = sample_constrained(matcher, smol_vocab.vocab_size, set(smol_vocab.eos_token_ids), gen, eos_bias=4.0)
        text = smol_tokenizer.decode(tokens)
        parsed = parse_tool_calls(text, fmt)
        assert parsed.content is None, text
        check_calls(parsed.tool_calls, names)
        assert parallel or len(parsed.tool_calls) == 1


def test_generic_auto_allows_a_plain_response(smol_tokenizer, smol_vocab):
    constraint = tool_constraint(smol_tokenizer, GENERIC, TOOLS, "auto", False)
    matcher = GrammarMatcher(smol_vocab, constraint)
    reply = smol_tokenizer.encode('{"response": "It is sunny."}', add_bos=False)
    assert matcher.advance(reply) == len(reply) and matcher.is_accepting()
    assert parse_tool_calls(smol_tokenizer.decode(reply), GENERIC).content == "It is sunny."


def test_no_constraint_where_the_reply_is_free(smol_tokenizer):
    assert tool_constraint(smol_tokenizer, HERMES, TOOLS, "auto", True) is None
    assert tool_constraint(smol_tokenizer, GENERIC, TOOLS, "none", True) is None
    assert tool_constraint(smol_tokenizer, GENERIC, [], "auto", True) is None


def test_bad_parameter_schema_names_the_tool():
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": "x"}}}
    with pytest.raises(ConstraintError) as info:
        check_tools([WEATHER, bad])
    assert info.value.param == "tools.1.function.parameters"


@pytest.mark.skipif(not os.path.exists(PAIR_QWEN), reason="the real pair is not downloaded")
def test_qwen_tokenizer_forces_its_tool_call_token():
    """Qwen's <tool_call> is one token; a required call is forced to start with it."""
    from speclm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(PAIR_QWEN)
    matcher = GrammarMatcher(GrammarVocab.of(tokenizer), tool_constraint(tokenizer, HERMES, TOOLS, "required", False))
    forced = matcher.forced_tokens()
    assert forced[0] == tokenizer.token_to_id("<tool_call>")
    assert tokenizer.decode(forced, skip_special_tokens=False) == '<tool_call>\n{"name": "get'
    # the model ends a reply after a call with <|endoftext|>: it stops generation as <|im_end|> does
    assert [tokenizer.decode([t], skip_special_tokens=False) for t in tokenizer.eos_token_ids] == [
        "<|im_end|>",
        "<|endoftext|>",
    ]


def _strict(tool: dict) -> dict:
    return {**tool, "function": {**tool["function"], "strict": True}}


def _accepts(matcher, tokenizer, text: str) -> bool:
    ids = tokenizer.encode(text, add_bos=False)
    return matcher.advance(ids) == len(ids) and matcher.is_accepting()


def _strict_auto_checks(tokenizer, vocab) -> None:
    """Under `auto` with a strict tool: free text, and once a call opens, its arguments follow the
    strict function's schema; a non-strict function's arguments are any object."""
    constraint = tool_constraint(tokenizer, HERMES, [_strict(WEATHER), TIME], "auto", False)
    assert constraint is not None
    new = lambda: GrammarMatcher(vocab, constraint)  # noqa: E731
    assert _accepts(new(), tokenizer, "It is sunny in Lyon, no tool needed.")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "C"}}\n</tool_call>'
    assert _accepts(new(), tokenizer, "Let me look.\n" + call)
    assert _accepts(new(), tokenizer, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')
    bad = tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": {"town": "Lyon"}}', add_bos=False)
    assert new().advance(bad) < len(bad)  # a key the strict schema does not have
    unknown = tokenizer.encode('<tool_call>\n{"name": "get_mail", "arguments": {}}', add_bos=False)
    assert new().advance(unknown) < len(unknown)
    if tokenizer.token_to_id("<tool_call>") is not None:  # (a tag spelled as text may follow as free text)
        twice = tokenizer.encode(call + "\n" + call, add_bos=False)
        assert new().advance(twice) < len(twice)  # one call without parallel_tool_calls
    parallel = tool_constraint(tokenizer, HERMES, [_strict(WEATHER), TIME], "auto", True)
    assert _accepts(GrammarMatcher(vocab, parallel), tokenizer, call + "\n" + call)
    parsed = parse_tool_calls("Let me look.\n" + call, HERMES)
    assert parsed.content.strip() == "Let me look." and len(parsed.tool_calls) == 1


def test_strict_arguments_under_auto_text_tags(qwen_style, smol_vocab):
    """A Hermes template whose tokenizer spells the tags as text: the call opens at a lazy lexeme."""
    _strict_auto_checks(qwen_style, smol_vocab)
    constraint = tool_constraint(qwen_style, HERMES, [_strict(WEATHER)], "auto", True)
    gen, params = torch.Generator().manual_seed(5), SamplingParams(temperature=1.0)
    for _ in range(6):  # random sampling once a call is open: the call closes, its arguments fit
        matcher = GrammarMatcher(smol_vocab, constraint)
        tokens = qwen_style.encode("Checking.\n<tool_call>", add_bos=False)
        assert matcher.advance(tokens) == len(tokens)
        while "</tool_call>" not in qwen_style.decode(tokens):
            assert len(tokens) < 300, qwen_style.decode(tokens)
            logits = torch.randn(1, smol_vocab.vocab_size, generator=gen) * 4
            token = int(select_masked(logits, params, matcher.allowed_mask()[None], gen)[0])
            assert matcher.advance([token]) == 1
            tokens.append(token)
        check_calls(parse_tool_calls(qwen_style.decode(tokens), HERMES).tool_calls, {"get_weather"})


@pytest.mark.skipif(not os.path.exists(PAIR_QWEN), reason="the real pair is not downloaded")
def test_strict_arguments_under_auto_qwen_tag_tokens():
    """Qwen's tags are single tokens: free text ends where the model writes <tool_call>."""
    from speclm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(PAIR_QWEN)
    _strict_auto_checks(tokenizer, GrammarVocab.of(tokenizer))


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_call_may_end_its_line_before_the_turn(qwen_style, smol_vocab, parallel):
    """After a call the reply may end, with or without a newline; with parallel_tool_calls a newline may
    also open another call. (A newline that could only open a call made Qwen2.5, which writes
    "</tool_call>\\n" and then ends its turn, chain calls greedily until max_tokens.)"""
    constraint = tool_constraint(qwen_style, HERMES, TOOLS, "required", parallel)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "C"}}\n</tool_call>'
    assert _accepts(GrammarMatcher(smol_vocab, constraint), qwen_style, call)
    assert _accepts(GrammarMatcher(smol_vocab, constraint), qwen_style, call + "\n")
    assert _accepts(GrammarMatcher(smol_vocab, constraint), qwen_style, call + "\n" + call) == parallel
