"""Real chat templates render like transformers' apply_chat_template: Qwen3's (enable_thinking, tools, reasoning
split out of earlier replies), Llama 3.2's (strftime_now, raise_exception, tojson with indent), Phi-3.5-mini's
and Phi-4-mini's, and the Jinja loop controls; chat_template_kwargs reach the template through the Python API
and the server (as vLLM and llama-server take them), and the names the renderer sets are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclm.structured.tools import HERMES, render_tool_prompt, tool_format
from speclm.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "<|tool|>",
    "<|/tool|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n42"},
    {"role": "user", "content": "Und 2 + 2? 日本語で答えて。 `print(2 + 2)`"},
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
]


def _tokenizer_dir(directory: Path, template: str, bos: str, eos: str) -> Path:
    """A small byte-level BPE tokenizer.json with the templates' special tokens, and its tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator([json.dumps(CHAT + TOOL_TURNS)] * 3, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def _pair(tmp_path, name: str, bos: str = "<|endoftext|>", eos: str = "<|endoftext|>"):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    directory = _tokenizer_dir(tmp_path / name, template, bos, eos)
    return load_tokenizer(str(directory)), transformers.AutoTokenizer.from_pretrained(str(directory))


def _theirs(theirs, messages, **kwargs) -> str:
    return theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


@pytest.mark.parametrize("thinking", [None, True, False])
def test_qwen3_enable_thinking_renders_like_transformers(thinking, tmp_path):
    ours, theirs = _pair(tmp_path, "qwen3")
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    for messages in (CHAT, CHAT[1:2], CHAT[1:3]):
        rendered = ours.apply_chat_template(messages, template_kwargs=kwargs)
        assert rendered == _theirs(theirs, messages, **kwargs)
        assert rendered.endswith("<think>\n\n</think>\n\n") == (thinking is False)
        assert ours.encode_chat(messages, kwargs) == theirs.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs
        )


def test_qwen3_tools_render_through_its_template_like_transformers(tmp_path):
    """Tools, a call and its result go through Qwen3's own template (the Hermes format), enable_thinking too."""
    ours, theirs = _pair(tmp_path, "qwen3")
    assert tool_format(ours.chat_template) == HERMES
    rendered = render_tool_prompt(ours, TOOL_TURNS, [WEATHER], "auto", True, {"enable_thinking": False})
    calls = [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in TOOL_TURNS[1]["tool_calls"]
    ]
    hf_messages = [TOOL_TURNS[0], {**TOOL_TURNS[1], "tool_calls": calls}, TOOL_TURNS[2]]
    assert rendered == _theirs(theirs, hf_messages, tools=[WEATHER], enable_thinking=False)
    assert '"name": "get_weather"' in rendered and "<tool_response>\n18 C, sunny\n</tool_response>" in rendered


def test_llama32_strftime_now_raise_exception_and_tojson_indent(tmp_path):
    """Llama 3.2's template: today's date from strftime_now, tools as tojson(indent=4) in the first user
    message, and raise_exception (a second tool call in one turn)."""
    ours, theirs = _pair(tmp_path, "llama3.2", bos="<|begin_of_text|>", eos="<|eot_id|>")
    for _ in range(2):  # (rendered again should the day change between the two renders)
        rendered = ours.apply_chat_template(CHAT[1:2], tools=[WEATHER])
        expected = _theirs(theirs, CHAT[1:2], tools=[WEATHER])
        if rendered == expected:
            break
    assert rendered == expected
    from datetime import datetime

    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in rendered
    assert '    "type": "function"' in rendered  # (indent=4)
    two_calls = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}}] * 2}]
    with pytest.raises(Exception, match="only supports single tool-calls"):
        ours.apply_chat_template(CHAT[1:2] + two_calls)


@pytest.mark.parametrize("name", ["phi3.5-mini", "phi4-mini"])
def test_phi_templates_render_like_transformers(name, tmp_path):
    """Phi-3.5-mini's and Phi-4-mini's templates (<|user|> ... <|end|>, <|assistant|> to answer); Phi-4-mini
    puts a system message's `tools` (a JSON string) between <|tool|> tags."""
    ours, theirs = _pair(tmp_path, name)
    system = {**CHAT[0], "tools": json.dumps([WEATHER])} if name == "phi4-mini" else CHAT[0]
    for messages in (CHAT, CHAT[1:], [system, *CHAT[1:]]):
        rendered = ours.apply_chat_template(messages)
        assert rendered == _theirs(theirs, messages)
        assert rendered.startswith("<|system|>" if messages[0]["role"] == "system" else "<|user|>")
        assert "<|end|>" in rendered and rendered.endswith("<|assistant|>" + ("\n" if name == "phi3.5-mini" else ""))
    if name == "phi4-mini":
        assert "<|tool|>" + json.dumps([WEATHER]) + "<|/tool|>" in ours.apply_chat_template([system, *CHAT[1:]])


def test_loop_controls_and_loop_variables(tmp_path):
    """{% break %} and {% continue %} (jinja2's loopcontrols, which transformers enables), loop.first /
    loop.last / loop.index, namespace(), and the filters real templates use."""
    template = (
        "{%- set ns = namespace(users=0) -%}"
        "{%- for m in messages -%}"
        "{%- if m.role == 'system' %}{% continue %}{% endif -%}"
        "{%- if loop.index > 3 %}{% break %}{% endif -%}"
        "{%- set ns.users = ns.users + (1 if m.role == 'user' else 0) -%}"
        "[{{ loop.index }}{{ '^' if loop.first }}{{ '$' if loop.last }}:{{ m.role | upper }}:"
        "{{ m.content | trim | replace('\\n', ' ') | truncate(12, True, '~') }}]"
        "{%- endfor -%}"
        "{{ ns.users }}|{{ messages | map(attribute='role') | reject('equalto', 'system') | join(',') }}"
        "{%- if add_generation_prompt %}>{% endif -%}"
    )
    directory = _tokenizer_dir(tmp_path / "loops", template, "<|endoftext|>", "<|endoftext|>")
    ours, theirs = load_tokenizer(str(directory)), transformers.AutoTokenizer.from_pretrained(str(directory))
    for messages in (CHAT, CHAT[1:], CHAT + CHAT):
        assert ours.apply_chat_template(messages) == _theirs(theirs, messages)
    # (the system message continued past, the fourth broken off before; truncate's leeway keeps short texts)
    assert ours.apply_chat_template(CHAT) == "[2:USER:What is 12 + 30?][3:ASSISTANT:<think> add~]1|user,assistant,user>"


def test_reserved_template_kwargs_are_refused(tmp_path):
    ours, _ = _pair(tmp_path, "qwen3")
    for key in ("messages", "tools", "add_generation_prompt"):
        with pytest.raises(ValueError, match=f"chat_template_kwargs may not set '{key}'"):
            ours.apply_chat_template(CHAT, template_kwargs={key: 1})


# -- through the Python API and the server ----------------------------------------------------------
SWITCH = (  # stories260K's words; the template turns on the flag as Qwen3's does
    "{% for m in messages %}{{ m.content }} {% endfor %}"
    "{% if enable_thinking is defined and enable_thinking is false %}once upon a time {% endif %}"
)


@pytest.fixture(scope="module")
def switch_llm():
    from speclm import LLM
    from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, threads=1)
    llm.tokenizer.chat_template = SWITCH
    return llm


def test_chat_template_kwargs_through_the_python_api(switch_llm):
    from speclm import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0)
    asked = [{"role": "user", "content": "the cat"}]
    plain = switch_llm.chat(asked, params)
    off = switch_llm.chat(asked, params, chat_template_kwargs={"enable_thinking": False})
    expected = switch_llm.tokenizer.encode("the cat once upon a time ", add_bos=False)
    assert off.stats.prompt_tokens == len(expected) and plain.stats.prompt_tokens < len(expected)
    assert off.token_ids == switch_llm.generate([expected], params)[0].token_ids


@pytest.mark.slow
def test_chat_template_kwargs_through_the_server(switch_llm):
    import httpx

    from tests.server.conftest import running_server

    asked = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 2, "temperature": 0}
    expected = len(switch_llm.tokenizer.encode("the cat once upon a time ", add_bos=False))
    with running_server(switch_llm) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            plain = client.post("/v1/chat/completions", json=asked).json()["usage"]["prompt_tokens"]
            body = asked | {"chat_template_kwargs": {"enable_thinking": False}}
            off = client.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
            assert off == expected and plain < expected
            for bad in ({"messages": []}, "enable_thinking"):
                r = client.post("/v1/chat/completions", json=asked | {"chat_template_kwargs": bad})
                assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
