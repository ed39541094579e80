"""`speclm export gguf`: a compression output (or any model) becomes a GGUF that our loader and llama.cpp run
with the source model's logits and greedy tokens."""

import numpy as np
import pytest
import torch

from speclm import LLM, SamplingParams
from speclm.cli import main
from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.models.gguf_loader import field_value, load_gguf, open_gguf
from speclm.models.loader import load_checkpoint
from tests.compress.conftest import stories_command
from tests.compress.test_checkpoint_io import PROMPT_IDS, logits_of
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

PROMPT = "Once upon a time, there was a little"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def gptq_dir(tmp_path_factory):
    """stories260K quantized to int4 (RTN, g64 so the 64-wide rows hold a group): a quantized compression output."""
    out = tmp_path_factory.mktemp("rtn") / "rtn-int4"
    assert stories_command("quantize", "--method", "rtn-int4", "--group-size", "64", "--out", str(out)) == 0
    return str(out)


@pytest.fixture(scope="module")
def exported(gptq_dir, tmp_path_factory):
    """The quantized directory exported at each tensor type (the directory's tokenizer.json has no
    SentencePiece scores, so the llama2.c tokenizer is given, as a user would)."""
    paths = {}
    for kind in ("f32", "f16", "q8_0"):
        paths[kind] = str(tmp_path_factory.mktemp("gguf") / f"stories-{kind}.gguf")
        assert (
            main(
                [
                    "export",
                    "gguf",
                    "--model",
                    gptq_dir,
                    "--tokenizer",
                    STORIES_TOKENIZER,
                    "--out",
                    paths[kind],
                    "--type",
                    kind,
                ]
            )
            == 0
        )
    return paths


@pytest.mark.parametrize("kind,bound", [("f32", 1e-5), ("f16", 2e-2), ("q8_0", 0.5)])
def test_exported_gguf_has_the_source_logits(gptq_dir, exported, kind, bound):
    source = logits_of(rebuild(load_checkpoint(gptq_dir)), PROMPT_IDS)  # [n, vocab]
    ours = logits_of(rebuild(load_checkpoint(exported[kind])), PROMPT_IDS)
    assert (ours - source).abs().max().item() <= bound
    if kind != "q8_0":
        assert torch.equal(ours.argmax(-1), source.argmax(-1))
    types = {"f32": 0, "f16": 1, "q8_0": 7}  # llama.cpp's general.file_type values
    assert field_value(open_gguf(exported[kind]), "general.file_type") == types[kind]
    stored = load_gguf(exported[kind]).metadata["gguf_tensor_types"]
    assert stored["model.layers.0.mlp.up_proj.weight"] == kind.upper()
    # down_proj rows are 172 long, not whole Q8_0 blocks: written F16, as llama.cpp's converter does.
    assert stored["model.layers.0.mlp.down_proj.weight"] == ("F16" if kind == "q8_0" else kind.upper())


def test_exported_tokenizer_round_trips(exported):
    _, original = load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)
    reloaded = LLM(exported["f32"]).tokenizer  # the tokenizer inside the GGUF
    text = 'Once upon a time, Lily saw a big dog. It was 3 o\'clock!\n"Hi," she said.'
    assert reloaded.encode(text) == original.encode(text)
    assert reloaded.decode(original.encode(text)) == text


def llama_cpp_agrees_with_us(path: str, prompt: str) -> None:
    """llama.cpp tokenizes `prompt` as we do and its greedy tokens equal ours (both reading `path`)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ours = LLM(path, threads=1)
    expected = ours.generate(prompt, GREEDY)[0].token_ids
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, n_threads=1, logits_all=True, verbose=False)
    ids = llm.tokenize(prompt.encode(), add_bos=ours.tokenizer.add_bos)
    assert ids == ours.tokenizer.encode(prompt)
    llm.eval(ids)
    got = []
    for _ in range(GREEDY.max_tokens):
        got.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))  # llama.cpp's logits for the last position
        llm.eval([got[-1]])
    assert got == expected


def test_llama_cpp_runs_the_export_with_our_greedy_tokens(exported):
    llama_cpp_agrees_with_us(exported["f32"], PROMPT)  # SentencePiece tokenizer, int4 weights


def test_export_errors_are_clear(gptq_dir, tmp_path, capsys):
    assert main(["export", "gguf", "--model", gptq_dir, "--out", str(tmp_path / "x.bin")]) == 2
    assert "--out must name a .gguf file" in capsys.readouterr().err
    # The saved tokenizer.json has byte fallback but no scores: the error says to pass the original tokenizer.
    assert main(["export", "gguf", "--model", gptq_dir, "--out", str(tmp_path / "x.gguf")]) == 2
    assert "--tokenizer" in capsys.readouterr().err


def test_llama_cpp_runs_the_exported_default_model_like_us(tmp_path):
    """The byte-level BPE path on the real default model: f16 export, same prompt ids and greedy tokens."""
    pytest.importorskip("llama_cpp")
    path = str(tmp_path / "smollm2-f16.gguf")
    assert main(["export", "gguf", "--out", path, "--type", "f16"]) == 0
    llama_cpp_agrees_with_us(path, "def fibonacci(n):")
