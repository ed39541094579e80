"""The native (C++) decoder of GGUF-native models: the same hidden states and cache as the Python
layers, bit for bit, for the rows it runs (a contiguous cache's decoding rows, as a draft model's)."""

import pytest
import torch

from speclm.llm import LLM
from speclm.models.attention import AttentionMetadata
from speclm.models.builder import build_model
from speclm.models.gguf_weights import native_kernels
from speclm.models.loader import load_checkpoint
from speclm.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="no GGUF-native kernels here (AVX-512 VNNI or AVX2)")


@pytest.fixture(scope="module", params=["auto", "q4_0"])
def model(request):
    m = build_model(load_checkpoint(None), weights=request.param)  # the default model's GGUF file
    m.use_lean_ops()
    assert m.native_decoder is not None
    return m


def feed(model, cache, tokens: list[int], num_layers: int | None = None) -> torch.Tensor:
    start = cache.length
    hidden = model(
        torch.tensor(tokens),
        torch.arange(start, start + len(tokens)),
        cache,
        AttentionMetadata(start, len(tokens)),
        num_layers=num_layers,
    )
    cache.truncate(start + len(tokens))
    return hidden


@pytest.mark.parametrize("num_layers", [None, 5])
def test_native_decoder_equals_the_python_layers(model, num_layers):
    prompt, steps = [1, 504, 3458, 282, 4649, 314, 216, 1345, 28, 30, 77], [[421], [6, 19, 2047], [5]]
    native_cache, python_cache = model.new_cache(64, num_layers), model.new_cache(64, num_layers)
    decoder = model.native_decoder
    assert torch.equal(feed(model, native_cache, prompt, num_layers), feed(model, python_cache, prompt, num_layers))
    for tokens in steps:
        native = feed(model, native_cache, tokens, num_layers)
        model.native_decoder = None  # the same pass through the Python layers
        try:
            plain = feed(model, python_cache, tokens, num_layers)
        finally:
            model.native_decoder = decoder
        assert torch.equal(native, plain)
    n = native_cache.length
    assert torch.equal(native_cache.keys[:, :, :n], python_cache.keys[:, :, :n])
    assert torch.equal(native_cache.values[:, :, :n], python_cache.values[:, :, :n])


def test_native_decoder_rejects_rows_past_the_cache(model):
    cache = model.new_cache(4)
    feed(model, cache, [1, 2, 3])
    with pytest.raises(RuntimeError, match="slot out of range"):
        feed(model, cache, [4, 5])


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_engine_passes_run_natively_and_keep_their_tokens(spec):
    """The engine's paged passes (prefill, decoding, verification) take the native decoder, and the
    greedy tokens with it equal those of the Python layers."""
    llm = LLM(spec=spec, threads=2)  # the default model, --weights auto
    decoder = llm.model.native_decoder
    assert decoder is not None
    rows = []

    class Counting:  # the decoder's interface, counting the rows of each pass
        def run(self, *args):
            rows.append(args[0].shape[0])
            return decoder.run(*args)

    params = SamplingParams(max_tokens=32, temperature=0.0)
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    llm.model.native_decoder = Counting()
    native = llm.generate(prompt, params)[0].token_ids
    assert len(rows) > 2 and max(rows) > 2  # the prompt's rows, then decoding (or verification) rows
    llm.model.native_decoder = None
    assert llm.generate(prompt, params)[0].token_ids == native
