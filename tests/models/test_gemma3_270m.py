"""The real Gemma-3-270M (Q4_K_M GGUF, `make gemma`): its tokenizer encodes like transformers' GGUF tokenizer,
its chat template renders like Gemma's, and greedy text on its own grids is sensible and the same with n-gram
speculation. Skipped when the file has not been fetched."""

from __future__ import annotations

import pytest

from speclm.data.gemma import gemma_path
from speclm.sampling_params import SamplingParams

GEMMA = gemma_path()
pytestmark = pytest.mark.skipif(GEMMA is None, reason="Gemma-3-270M not fetched (make gemma)")

# What transformers 5.24's tokenizer for this GGUF (AutoTokenizer.from_pretrained(..., gguf_file=...)) gives;
# recorded, because building it takes over a minute.
TRANSFORMERS_IDS = {
    "The capital of France is": [2, 818, 5279, 529, 7001, 563],
    "Hello  world\n\n  def f(x):\n\treturn x**2 # 平方": [
        2, 9259, 138, 12392, 108, 138, 2063, 517, 236769, 236781, 1473, 107, 255968, 2060, 1123, 1018, 236778, 997,
        61628, 237256,
    ],
    "Ça va? Привет мир! 日本語のテキスト 🙂 1234567": [
        2, 231436, 5380, 236881, 15745, 8362, 58562, 236888, 33375, 238582, 236945, 95830, 57235, 236743, 236770,
        236778, 236800, 236812, 236810, 236825, 236832,
    ],
    "<start_of_turn>user\nhi<end_of_turn>": [2, 105, 2364, 107, 2202, 106],
}  # fmt: skip


@pytest.fixture(scope="module")
def gemma_llm():
    from speclm import LLM

    return LLM(GEMMA, threads=1)


def test_tokenizer_encodes_like_transformers(gemma_llm):
    tokenizer = gemma_llm.tokenizer
    for text, ids in TRANSFORMERS_IDS.items():
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids, skip_special_tokens="<start" not in text) == "<bos>" * ("<start" in text) + text
    assert tokenizer.eos_token_ids == [1, 106]  # <eos>, and <end_of_turn> ends a reply


def test_chat_template_renders_like_gemmas(gemma_llm):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
    ]
    assert gemma_llm.tokenizer.apply_chat_template(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(Exception, match="alternate"):
        gemma_llm.tokenizer.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_greedy_text_is_sensible_and_speculation_is_exact(gemma_llm):
    params = SamplingParams(max_tokens=16, temperature=0.0)
    plain = gemma_llm.generate("The capital of France is", params)[0]
    assert plain.text.startswith(" the capital of the country of France")  # llama.cpp: the same 9 words
    for method in ("ngram", "lookahead"):
        spec = gemma_llm.with_spec(method).generate("The capital of France is", params)[0]
        assert spec.token_ids == plain.token_ids, method
