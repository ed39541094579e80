"""A draft's output head over a token map: the map's ids, and the context's tokens outside it."""

import pytest
import torch

from speclm import SamplingParams
from speclm.compress.gguf_export import export_gguf
from speclm.models.builder import build_model
from speclm.models.gguf_weights import native_kernels
from speclm.models.loader import load_checkpoint
from speclm.speculative.draft_model import DraftModelProposer
from speclm.speculative.factory import frequent_tokens
from tests.models.hf_tiny import tiny_hf_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(native_kernels() is None, reason="no GGUF-native kernels here (AVX-512 VNNI or AVX2)")


@pytest.mark.parametrize("weights", ["auto", "q4_0"])
def test_context_tokens_outside_the_map_get_head_columns(tmp_path, weights):
    """A draft over a token map also scores the context's tokens outside it: with a context holding every
    token, it proposes (greedy, and sampled with the same probabilities) as the whole head does; without
    those columns (a proposer that never adds them) it proposes otherwise. Its prompt memo and cache are
    the same either way."""
    tiny_hf_model(transformers.LlamaConfig).save_pretrained(tmp_path)  # an untied head
    path = str(tmp_path / "draft-q8_0.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "Q8_0")
    model = build_model(load_checkpoint(path), weights=weights)
    vocab = model.config.vocab_size
    token_map = frequent_tokens(vocab // 4, vocab, [])
    context = list(range(vocab))[::-1]  # every token, so each one outside the map gets a column
    whole = DraftModelProposer(model)
    mapped = DraftModelProposer(model, token_map=token_map)
    map_only = DraftModelProposer(model, token_map=token_map)
    map_only.head.in_map = None  # (never adds the context's columns)
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0)
    proposals = {}
    for name, draft in [("whole", whole), ("mapped", mapped), ("map only", map_only)]:
        draft.start(context, 256)
        proposals[name] = draft.propose(context, 4, greedy, None)
        draft.start(context, 256)
        proposals[name, "sampled"] = draft.propose(context, 4, sampled, torch.Generator().manual_seed(0))
    assert sorted(mapped.head.columns.tolist()) == list(range(vocab))
    assert proposals["mapped"].tokens == proposals["whole"].tokens
    assert any(t >= vocab // 4 for t in proposals["whole"].tokens)  # (so the map alone cannot propose them)
    assert proposals["map only"].tokens != proposals["whole"].tokens
    assert proposals["mapped", "sampled"].tokens == proposals["whole", "sampled"].tokens
    torch.testing.assert_close(proposals["mapped", "sampled"].probs, proposals["whole", "sampled"].probs)


def test_a_frequent_token_map_keeps_the_tokenizers_added_tokens(tmp_path):
    """A draft's map of the lowest ids also holds the tokenizer's added tokens (the highest ids: chat
    markers, tool-call tags), or the draft could never propose the end of a turn's markers."""
    from tokenizers import Tokenizer, models

    from speclm.config import SpecConfig
    from speclm.speculative.factory import build_draft_proposer

    vocab, added = 160, ["<|im_start|>", "<|im_end|>", "<tool_call>"]
    base = vocab - len(added)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(base)}, unk_token="w0"))
    backend.add_special_tokens(added)
    tiny_hf_model(transformers.LlamaConfig, vocab_size=vocab).save_pretrained(tmp_path)
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')

    spec = SpecConfig.parse(f"draft:{tmp_path},vocab=100,lookup=off,weights=fp32")
    draft = build_draft_proposer(spec, vocab)
    assert draft.head.token_map.tolist() == list(range(100)) + [base, base + 1, base + 2]
    assert draft.head.logits(torch.zeros(1, 64)).shape == (1, 103)
