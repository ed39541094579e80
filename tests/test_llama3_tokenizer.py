"""The Llama 3 tokenizer (byte-level BPE behind Llama 3's pre-tokenizer regex, GGUF pre 'llama-bpe') and its
chat template: a tokenizer built here with the `tokenizers` library (no hub access) encodes and renders like
transformers' from its tokenizer.json, and again after a GGUF round trip, where speclm rebuilds the
pre-tokenizer from the name 'llama-bpe' alone."""

from __future__ import annotations

import json
import os

import pytest

from speclm.tokenizer import _LLAMA3_SPLIT, load_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Llama 3.1's template, without its tool-calling branches (speclm's apply_chat_template takes no tools).
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Only user and assistant roles are supported after the system message') }}
    {%- endif %}
    {%- if loop.index0 > 8 %}{% break %}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
TEXTS = [
    "Hello world, it's a test. They'll say I'd've done it!",
    "def f(x):\n    return x ** 2  # 12345678\n\n\tif x != y: pass",
    "café naïve 日本語のテキスト Привет мир 😀👍🏽",
    "   leading spaces and trailing   ",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
]
MESSAGES = [
    {"role": "system", "content": "You are terse. "},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "And 2 + 2?"},
]


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """A Llama-3-style tokenizer.json (trained on TEXTS and some code) with its tokenizer_config.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE(ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(TEXTS * 3 + [open(__file__).read()], trainer)
    bos = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    directory = tmp_path_factory.mktemp("llama3-tokenizer")
    backend.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA31_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(directory / "tokenizer_config.json", "w") as f:
        json.dump(config, f)
    return directory


def _same_as_transformers(ours, theirs) -> None:
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.encode(text)[0] == ours.bos_token_id
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text), skip_special_tokens=True)
    for messages in (MESSAGES, MESSAGES[1:]):
        rendered = ours.apply_chat_template(messages)
        assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert ours.encode_chat(messages) == theirs.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )


def test_llama3_tokenizer_and_chat_template_match_transformers(llama3_dir):
    theirs = transformers.AutoTokenizer.from_pretrained(str(llama3_dir))
    ours = load_tokenizer(str(llama3_dir))
    _same_as_transformers(ours, theirs)
    with pytest.raises(Exception, match="Only user and assistant"):
        ours.apply_chat_template([{"role": "tool", "content": "x"}])


def test_llama3_tokenizer_survives_gguf_as_llama_bpe(llama3_dir, tmp_path):
    """Exported as llama.cpp's converter writes Llama 3 (gpt2 model, pre 'llama-bpe'), read back."""
    from speclm.compress.gguf_export import export_gguf
    from speclm.models.gguf_loader import field_value, open_gguf
    from speclm.models.loader import load_checkpoint
    from tests.models.hf_tiny import tiny_hf_model

    source = load_tokenizer(str(llama3_dir))
    model = tiny_hf_model(
        transformers.LlamaConfig,
        vocab_size=source.vocab_size,
        num_hidden_layers=1,
        bos_token_id=source.bos_token_id,
        eos_token_id=source.eos_token_ids[0],
    )
    model.save_pretrained(tmp_path)
    path = str(tmp_path / "llama3.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), source, path, "F32")
    assert field_value(open_gguf(path), "tokenizer.ggml.pre") == "llama-bpe"
    ours = load_tokenizer(path)
    assert os.path.exists(path) and ours.add_bos
    _same_as_transformers(ours, transformers.AutoTokenizer.from_pretrained(str(llama3_dir)))
