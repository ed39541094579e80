"""A draft model whose output head is a GGUF tensor of its own loads only its token map's rows."""

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
pytestmark = pytest.mark.skipif(native_kernels() is None, reason="no AVX-512 VNNI kernels here")


@pytest.mark.parametrize("weights", ["auto", "q4_0"])
def test_a_draft_loaded_with_only_its_head_rows_proposes_as_the_whole_head(tmp_path, weights):
    """In the draft form (q4_0) the head's rows are re-quantized too, row by row: the subset's rows are the
    whole head's rows."""
    tiny_hf_model(transformers.LlamaConfig).save_pretrained(tmp_path)  # an untied head
    path = str(tmp_path / "draft-q8_0.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "Q8_0")
    vocab = load_checkpoint(path).config.vocab_size
    token_map = frequent_tokens(vocab // 2, vocab, [vocab - 1])
    subset = build_model(load_checkpoint(path), weights=weights, head_rows=token_map)
    whole = build_model(load_checkpoint(path), weights=weights)
    assert subset.head_rows is token_map and whole.head_rows is None
    assert subset.lm_head.out_features == len(token_map) and whole.lm_head.out_features == vocab
    head_type = "Q4_0" if weights == "q4_0" else "Q8_0"
    for model in (subset, whole):
        assert [s.type_name for s in model.lm_head.segments] == [head_type]
    drafts = [DraftModelProposer(m, token_map=token_map) for m in (subset, whole)]
    assert drafts[0].lm_head is subset.lm_head  # not selected a second time
    ids = list(range(5, 30))
    proposals = []
    for draft in drafts:
        draft.start(ids, 64)
        proposals.append(draft.propose(ids, 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)))
    assert proposals[0].tokens == proposals[1].tokens
    assert torch.equal(proposals[0].probs, proposals[1].probs)


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
    assert draft.token_map.tolist() == list(range(100)) + [base, base + 1, base + 2]
    assert draft.lm_head(torch.zeros(1, 64)).shape == (1, 103)
