"""Request fields outside the schemas (server/request_fields.py), on both endpoints: what clients send by
default is served as if left out; a field this server does not implement is refused by name unless its
value asks for nothing; any other field is refused as unrecognized."""

import httpx
import openai
import pytest

from tests.server.conftest import running_server

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = "Once upon a time"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]
BASE = {COMPLETIONS: {"prompt": PROMPT}, CHAT: {"messages": MESSAGES}}

# What clients send with their defaults, beside the fields this server implements: LangChain's ChatOpenAI
# and OpenAI (completions) LLM (penalties at 0, logit_bias {}, n 1, best_of 1), the openai client's
# bookkeeping fields, vLLM's sampling defaults and llama-server apps' (cache_prompt, id_slot, the settings
# of its samplers that are off).
CLIENT_DEFAULTS = {
    "model": "gpt-4o-mini",
    "stream": False,
    "n": 1,
    "stop": None,
    "seed": 7,
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "logit_bias": {},
    "best_of": 1,
    "user": "someone",
    "store": False,
    "metadata": {"app": "test"},
    "service_tier": "auto",
    "safety_identifier": "hash",
    "prompt_cache_key": "k",
    "reasoning_effort": None,
    "min_p": 0,
    "repetition_penalty": 1.0,
    "skip_special_tokens": True,
    "stop_token_ids": [],
    "cache_prompt": True,
    "id_slot": -1,
    "repeat_last_n": 64,
    "repeat_penalty": 1,
    "typical_p": 1.0,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "n_probs": 0,
}


def post(url: str, path: str, extra: dict, **fields) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={**BASE[path], **fields, **extra}, timeout=120)


def served_as_if_left_out(url: str, path: str, extra: dict) -> None:
    plain = post(url, path, {}, max_tokens=8, temperature=0)
    with_extra = post(url, path, extra, max_tokens=8, temperature=0)
    assert plain.status_code == 200 and with_extra.status_code == 200, with_extra.text
    assert with_extra.json()["choices"] == plain.json()["choices"]


def completion_tokens(url: str, path: str, **fields) -> int:
    r = post(url, path, {}, temperature=0, ignore_eos=True, **fields)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["completion_tokens"]


@pytest.fixture(scope="module")
def server(stories_llm):  # (stories260K has no chat template: its chat requests fail after the field checks)
    with running_server(stories_llm) as (url, _):
        yield url


def test_fields_clients_send_by_default_are_served_as_if_left_out(server):
    served_as_if_left_out(server, COMPLETIONS, CLIENT_DEFAULTS)


@pytest.mark.slow
def test_chat_fields_clients_send_by_default_are_served_as_if_left_out(default_server):
    url, client = default_server
    served_as_if_left_out(url, CHAT, CLIENT_DEFAULTS)
    plain = client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=6, temperature=0)
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_completion_tokens=6,
        temperature=0,
        user="u",
        n=1,
        frequency_penalty=0,
        store=False,
        extra_body={"cache_prompt": True},
    )
    assert r.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="logit_bias is not supported"):
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, logit_bias={"5": 10})
    assert completion_tokens(url, CHAT, n_predict=5) == 5


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize(
    "field,value",
    [
        ("logit_bias", {"5": 10}),
        ("best_of", 2),
        ("echo", True),
        ("suffix", " and then"),
        ("repeat_penalty", True),  # (true is not 1)
        ("samplers", ["top_k", "temperature"]),
        ("grammar", 'root ::= "a"'),
        ("reasoning_effort", "low"),
    ],
)
def test_a_field_not_implemented_is_refused_by_name_unless_it_asks_for_nothing(server, path, field, value):
    r = post(server, path, {field: value}, max_tokens=2)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error == {
        "message": f"{field} is not supported by this server",
        "type": "invalid_request_error",
        "param": field,
        "code": None,
    }


@pytest.mark.parametrize(
    "path,field,value",
    [
        (COMPLETIONS, "max_token", 5),  # a typo of max_tokens would otherwise generate 16 tokens
        (CHAT, "temprature", 0),
        (COMPLETIONS, "messages", MESSAGES),  # the other endpoint's fields
        (CHAT, "prompt", PROMPT),
        (COMPLETIONS, "max_completion_tokens", 4),
        (CHAT, "foo", None),
    ],
)
def test_an_unknown_field_is_refused_as_unrecognized(server, path, field, value):
    r = post(server, path, {field: value}, max_tokens=2)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == f"unrecognized request argument: {field}" and error["param"] == field


def test_n_predict_is_llama_servers_max_tokens(server):
    assert completion_tokens(server, COMPLETIONS, n_predict=7) == 7
    assert completion_tokens(server, COMPLETIONS, n_predict=7, max_tokens=3) == 3  # OpenAI's name wins
    assert completion_tokens(server, COMPLETIONS) == 16  # no limit given: the endpoint's default


def test_minus_one_tokens_is_up_to_the_context_as_in_llama_server(server, stories_llm):
    """llama-server's apps (its web UI among them) send max_tokens or n_predict -1 for no limit."""
    context = stories_llm.engine.max_total_tokens
    for field in ("max_tokens", "n_predict"):
        r = post(server, COMPLETIONS, {}, temperature=0, ignore_eos=True, **{field: -1})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == context
    for path in (COMPLETIONS, CHAT):
        for value in (0, -2):
            assert post(server, path, {}, max_tokens=value).json()["error"]["param"] == "max_tokens"


def test_min_p_is_served(server):
    """min_p (vLLM's and llama-server's): 1.0 keeps only the likeliest token, so sampling gives greedy's text."""
    greedy = post(server, COMPLETIONS, {}, max_tokens=12, temperature=0).json()["choices"][0]["text"]
    for seed in (1, 2):
        r = post(server, COMPLETIONS, {}, max_tokens=12, temperature=1.5, seed=seed, min_p=1.0)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy, r.text
    sampled = {
        post(server, COMPLETIONS, {}, max_tokens=12, temperature=1.5, seed=s).json()["choices"][0]["text"]
        for s in (1, 2)
    }
    assert sampled != {greedy}  # (without min_p these draws leave the greedy text)
    assert post(server, CHAT, {}, min_p=1.5).json()["error"]["param"] == "min_p"
    for path in (COMPLETIONS, CHAT):
        r = post(server, path, {}, n_predict=0)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"


def test_penalties_are_served_as_the_engine_applies_them(server, stories_llm):
    """frequency, presence and repetition penalties reach the engine: the server's greedy text is the
    in-process engine's under the same penalties, and differs from the unpenalized text."""
    from speclm import SamplingParams

    penalties = {"frequency_penalty": 2.0, "presence_penalty": 1.0, "repetition_penalty": 1.8}
    r = post(server, COMPLETIONS, penalties, max_tokens=48, temperature=0)
    assert r.status_code == 200, r.text
    want = stories_llm.generate(PROMPT, SamplingParams(max_tokens=48, **penalties))[0].text
    unpenalized = stories_llm.generate(PROMPT, SamplingParams(max_tokens=48))[0].text
    assert r.json()["choices"][0]["text"] == want != unpenalized


@pytest.mark.parametrize(
    "field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0)]
)
def test_a_penalty_out_of_range_is_refused(server, field, value):
    r = post(server, COMPLETIONS, {field: value}, max_tokens=2)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
