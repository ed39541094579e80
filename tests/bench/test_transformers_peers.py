"""transformers as a `speclm bench` peer, interleaved with speclm's methods: plain generate and assisted
generation with a draft, each checked against transformers' own greedy text. A small random transformers
Llama over the tiny model's vocabulary stands in for a converted GGUF (loading one takes a minute)."""

import pytest

from speclm import LLM, SamplingParams
from speclm.bench.peers import TransformersBenchPeer, TransformersPeer
from speclm.bench.spec_bench import run_methods
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

transformers = pytest.importorskip("transformers")


def tiny_llama(seed: int):
    import torch

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_transformers_and_assisted_peers_run_interleaved_and_are_checked_against_their_own_ar():
    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, threads=1)

    def decode(ids):
        return llm.tokenizer.decode(ids, skip_special_tokens=False)

    target = tiny_llama(0)
    peers = [
        TransformersBenchPeer(TransformersPeer("-", model=target), decode),
        TransformersBenchPeer(TransformersPeer("-", model=target, assistant=tiny_llama(1), assistant_tokens=3), decode),
    ]
    prompts = [{"id": "p", "category": "code", "text": "Once upon a time"}]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    records = run_methods(llm, prompts, ["ar"], params, chat=False, progress=False, peers=peers)
    by_method = {r["method"]: r for r in records}
    assert set(by_method) == {"ar", "transformers", "transformers-assisted"}
    for name in ("transformers", "transformers-assisted"):
        assert by_method[name]["tokens"] == 12
        assert 0 <= by_method[name]["decode_seconds"] < by_method[name]["seconds"]
    # assisted greedy generation keeps the target's text whatever the assistant proposes
    assert by_method["transformers-assisted"]["matches_first_method"]


def test_a_peer_that_differs_from_its_family_reference_is_reported():
    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, threads=1)

    def decode(ids):
        return llm.tokenizer.decode(ids, skip_special_tokens=False)

    peers = [TransformersBenchPeer(TransformersPeer("-", model=m), decode) for m in (tiny_llama(0), tiny_llama(1))]
    prompts = [{"id": "p", "category": "code", "text": "Once upon a time"}]
    records = run_methods(
        llm, prompts, ["ar"], SamplingParams(max_tokens=12, ignore_eos=True), chat=False, progress=False, peers=peers
    )
    assert [r["matches_first_method"] for r in records if r["method"] == "transformers"] == [True, False]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peers", "foo"], "unknown peer 'foo'"),
        (["--peers", "transformers-assisted"], "need a draft:PATH method"),
    ],
)
def test_bench_rejects_unknown_peers_and_a_speculative_peer_without_a_draft(capsys, argv, message):
    from speclm.cli import main

    assert main(["bench", "--methods", "ar", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("speclm bench: error:") and message in err[0]
