"""phi3's two tokenizers encode a mixed multilingual and code text like transformers: Phi-3.5-mini's (Llama 2's
SentencePiece BPE with byte fallback, in a tokenizer.json) and Phi-4-mini's (byte-level BPE behind o200k's
pre-tokenizer regex, GGUF pre 'gpt-4o', read back from a GGUF where speclm rebuilds it from that name alone).
Tokenizers built here with the `tokenizers` library (no hub access)."""

from __future__ import annotations

import json

import pytest

from speclm.models.checkpoint import ModelLoadError
from speclm.tokenizer import _GPT4O_SPLIT, load_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

PHI_SPECIAL = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
TEXTS = [
    "Hello world, it's a TEST. They'LL say I'd've DONE it!",
    "def f(x):\n    return x ** 2  # 12345678\n\n\tif x != y: pass  // a/b/c\r\n",
    "café naïve 日本語のテキスト Привет мир ÇAĞRI 😀👍🏽",
    "   leading spaces and trailing   ",
    "<|user|>\nWas ist 12 + 30?<|end|>\n<|assistant|>\n",
]
CORPUS = TEXTS * 3 + [open(__file__).read()]


def _save(directory, backend, config: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def phi35_dir(tmp_path_factory):
    """Phi-3.5-mini's tokenizer.json shape: Llama 2's (normalizer prepends '▁' and replaces spaces, BPE with
    byte fallback) with Phi's chat tokens added, and its tokenizer_config.json's add_bos_token false. The
    reference reads the file's own pipeline (transformers 4 did; SentencePiece and llama.cpp split alike):
    transformers 5's LlamaTokenizer class swaps in a Metaspace pre-tokenizer that differs on runs of leading
    spaces and on text right after a special token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>", *byte_pieces])
    backend.train_from_iterator(CORPUS, trainer)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in PHI_SPECIAL])
    directory = tmp_path_factory.mktemp("phi35") / "tok"
    _save(
        directory,
        backend,
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "add_bos_token": False,
         "tokenizer_class": "PreTrainedTokenizerFast"},
    )  # fmt: skip
    return directory


@pytest.fixture(scope="module")
def phi4_dir(tmp_path_factory):
    """Phi-4-mini's tokenizer.json shape: o200k's split, then byte-level BPE; no BOS. (The reference reads the
    file's own pipeline: transformers 5's GPT2Tokenizer class, which Phi-4-mini's config names, swaps in GPT-2's
    split.)"""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(ignore_merges=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_GPT4O_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS, trainer)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in PHI_SPECIAL])
    directory = tmp_path_factory.mktemp("phi4") / "tok"
    _save(
        directory,
        backend,
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False,
         "tokenizer_class": "PreTrainedTokenizerFast"},
    )  # fmt: skip
    return directory


def _same_as_transformers(ours, theirs) -> None:
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text), skip_special_tokens=True)
    mixed = "".join(TEXTS)
    assert ours.encode(mixed) == theirs.encode(mixed)


def test_phi35_tokenizer_matches_transformers(phi35_dir):
    ours, theirs = load_tokenizer(str(phi35_dir)), transformers.AutoTokenizer.from_pretrained(str(phi35_dir))
    _same_as_transformers(ours, theirs)
    assert ours.add_bos is False and ours.token_to_id("<0xF0>") in ours.encode("\U0001f99c")  # (byte fallback)


def test_phi4_tokenizer_matches_transformers_and_survives_gguf_as_gpt_4o(phi4_dir, tmp_path):
    """Exported as llama.cpp's converter writes Phi-4-mini's (gpt2 model, pre 'gpt-4o'), read back."""
    from speclm.compress.gguf_export import export_gguf
    from speclm.models.gguf_loader import field_value, open_gguf
    from speclm.models.loader import load_checkpoint
    from tests.models.hf_tiny import tiny_hf_model

    source = load_tokenizer(str(phi4_dir))
    theirs = transformers.AutoTokenizer.from_pretrained(str(phi4_dir))
    _same_as_transformers(source, theirs)
    model = tiny_hf_model(
        transformers.Phi3Config, vocab_size=source.vocab_size, num_hidden_layers=1, pad_token_id=None,
        bos_token_id=source.bos_token_id, eos_token_id=source.eos_token_ids[0], tie_word_embeddings=True,
    )  # fmt: skip
    model.save_pretrained(tmp_path)
    path = str(tmp_path / "phi4.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), source, path, "F32")
    assert field_value(open_gguf(path), "tokenizer.ggml.pre") == "gpt-4o"
    read_back = load_tokenizer(path)
    _same_as_transformers(read_back, theirs)
    assert read_back.token_to_id("<|end|>") in read_back.eos_token_ids  # (replies end there, as in llama.cpp)


def test_unknown_gguf_pre_tokenizer_is_refused(phi4_dir, tmp_path):
    """A pre-tokenizer speclm does not rebuild is an error naming it, not GPT-2's split in its place."""
    from speclm.compress.gguf_export import export_gguf
    from speclm.models.loader import load_checkpoint
    from tests.models.hf_tiny import tiny_hf_model

    source = load_tokenizer(str(phi4_dir))
    tiny_hf_model(transformers.LlamaConfig, vocab_size=source.vocab_size, num_hidden_layers=1).save_pretrained(tmp_path)
    path = str(tmp_path / "tekken.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), source, path, "F32")
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.ggml.pre"]
    raw = bytes(field.parts[field.data[0]])
    data = bytearray(open(path, "rb").read())
    at = data.index(raw, data.index(b"tokenizer.ggml.pre"))
    data[at : at + len(raw)] = b"tekken"[: len(raw)].ljust(len(raw), b"x")  # ("gpt-4o" -> "tekken")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF pre-tokenizer 'tekken' \(supported: gpt2, .*gpt-4o\)"):
        load_tokenizer(str(bad))


def test_replies_end_at_end_of_turn(phi35_dir, tmp_path):
    """Phi's replies end with <|end|>: from a Hugging Face directory it is one of generation_config.json's EOS
    ids (where transformers' generate stops; config.json names only <|endoftext|>), and llama.cpp stops at it
    in a GGUF that does not name an end-of-turn token (as it does at gemma3's <end_of_turn>; checked on the
    phi3 GGUF above)."""
    import shutil

    directory = tmp_path / "phi35"
    shutil.copytree(phi35_dir, directory)
    ours = load_tokenizer(str(directory))
    end, endoftext = ours.token_to_id("<|end|>"), ours.token_to_id("<|endoftext|>")
    (directory / "config.json").write_text(json.dumps({"eos_token_id": endoftext}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [end, endoftext]}))
    assert set(load_tokenizer(str(directory)).eos_token_ids) == {end, endoftext}
