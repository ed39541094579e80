"""medusa:PATH and eagle:PATH: lossless greedy with untrained and randomly perturbed heads (exactness
must not depend on head quality), chains and trees, K = 1..8; the features they draft from are the
target's own at the right positions; bad head paths and options fail clearly."""

import pytest
import torch

from speclm import SamplingParams
from speclm.config import SpecConfig
from speclm.speculative.heads import EagleHead, MedusaHeads, save_head
from speclm.speculative.medusa import static_tree
from tests.helpers import ContiguousPass, generate_with_proposer
from tests.speculative.tree_proposers import OracleTreeProposer

PROMPTS = ["", "Once upon a time", "Tom and Lily went to the park. Tom"]
PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def head_dirs(stories_llm, tmp_path_factory):
    """Untrained and perturbed Medusa heads (3 heads, the perturbed one with a 64-token subset
    head) and EAGLE heads (default init; perturbed with a token_map)."""
    c = stories_llm.model.config
    root = tmp_path_factory.mktemp("heads")
    g = torch.Generator().manual_seed(0)
    dirs = {"medusa": save_head(MedusaHeads(c.hidden_size, c.vocab_size, 3), root / "medusa")}
    perturbed = MedusaHeads(c.hidden_size, c.vocab_size, 3, token_map=torch.randperm(c.vocab_size, generator=g)[:64])
    for p in perturbed.parameters():
        p.data += 0.2 * torch.randn(p.shape, generator=g)
    dirs["medusa-perturbed"] = save_head(perturbed, root / "medusa-perturbed")
    torch.manual_seed(0)
    dirs["eagle"] = save_head(EagleHead(c), root / "eagle")
    eagle = EagleHead(c, token_map=torch.arange(0, c.vocab_size, 2))
    for p in eagle.parameters():
        p.data += 0.5 * torch.randn(p.shape, generator=g)
    dirs["eagle-perturbed"] = save_head(eagle, root / "eagle-perturbed")
    return {k: str(v) for k, v in dirs.items()}


@pytest.fixture(scope="module")
def reference(stories_llm):
    return {p: stories_llm.generate(p, PARAMS)[0].token_ids for p in PROMPTS}


SPECS = {  # name -> (head, options)
    "medusa-tree": ("medusa", ""),
    "medusa-chain": ("medusa-perturbed", ",width=1"),
    "medusa-perturbed-tree": ("medusa-perturbed", ",width=4"),
    "eagle-tree": ("eagle", ""),
    "eagle-chain": ("eagle-perturbed", ",topk=1"),
    "eagle-perturbed-tree": ("eagle-perturbed", ",topk=3,beam=2,depth=4"),
}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", list(SPECS))
def test_head_speculation_greedy_equals_plain_greedy(stories_llm, head_dirs, reference, name):
    head, options = SPECS[name]
    method = head.split("-")[0]
    drafted = 0
    for k in range(1, 9):
        llm = stories_llm.with_spec(f"{method}:{head_dirs[head]}{options}", num_speculative_tokens=k, adaptive=False)
        prompt = PROMPTS[k % len(PROMPTS)]
        out = llm.generate(prompt, PARAMS)[0]
        assert out.token_ids == reference[prompt], (name, k, prompt)
        drafted += out.stats.drafted_tokens
    assert drafted > 0


def test_adaptive_head_speculation_is_exact(stories_llm, head_dirs, reference):
    for head in ("medusa-perturbed", "eagle-perturbed"):
        llm = stories_llm.with_spec(f"{head.split('-')[0]}:{head_dirs[head]}", num_speculative_tokens=8)
        for prompt, expected in reference.items():
            assert llm.generate(prompt, PARAMS)[0].token_ids == expected


class FeatureRecorder(OracleTreeProposer):
    """An oracle tree proposer that also collects the features the engine hands over."""

    wants_features = True
    feature_history = True  # every position's feature, so no prefix-cache reuse

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.features: list[torch.Tensor] = []

    def add_features(self, features: torch.Tensor) -> None:
        self.features.append(features.clone())


@pytest.mark.parametrize("k", [1, 6])
def test_features_are_the_targets_own_at_every_committed_position(stories_llm, k):
    """After generation the proposer holds f_0 .. f_{L-2}, equal to a fresh forward over the text."""
    ids = stories_llm.tokenizer.encode("Tom and Lily went to the park. Tom")
    full = ids + stories_llm.generate(ids, PARAMS)[0].token_ids
    proposer = FeatureRecorder(full, stories_llm.model.config.vocab_size, seed=k)
    out = generate_with_proposer(stories_llm, proposer, ids, PARAMS, k)
    assert ids + out.token_ids == full and max(proposer.accepted) >= min(k, 3)
    received = torch.cat(proposer.features)  # [L - 1, hidden]
    expected = ContiguousPass(stories_llm.model, len(full)).hidden(full[:-1], 0)
    assert received.shape == expected.shape
    torch.testing.assert_close(received, expected, rtol=1e-4, atol=1e-4)


def test_static_medusa_tree_is_parents_first_and_best_first():
    paths = static_tree(num_heads=3, num_nodes=10, width=3)
    assert len(paths) == 10 and len(set(paths)) == 10
    assert paths[:2] == [(0,), (0, 0)]
    for i, p in enumerate(paths):
        assert len(p) <= 3 and (len(p) == 1 or p[:-1] in paths[:i])
    assert static_tree(4, 4, 1) == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]  # width 1: a chain


def test_bad_head_paths_and_options_fail_clearly(stories_llm, head_dirs, tmp_path):
    with pytest.raises(ValueError, match="not a draft-head directory"):
        stories_llm.with_spec(f"eagle:{tmp_path}")
    with pytest.raises(ValueError, match="holds a medusa head"):
        stories_llm.with_spec(f"eagle:{head_dirs['medusa']}")
    with pytest.raises(ValueError, match="bad eagle option 'width=2'"):
        SpecConfig.parse(f"eagle:{head_dirs['eagle']},width=2")
    with pytest.raises(ValueError, match="bad medusa option 'width=0'"):
        SpecConfig.parse(f"medusa:{head_dirs['medusa']},width=0")
    with pytest.raises(ValueError, match="needs a head directory"):
        SpecConfig.parse("medusa")


def test_cli_runs_heads_and_rejects_bad_ones(head_dirs, tmp_path, capsys):
    from tests.test_bad_input import STORIES, assert_one_error_line, run_cli

    code, out, _ = run_cli(
        capsys,
        "generate",
        "--prompt",
        "Once",
        *STORIES,
        "--max-tokens",
        "8",
        "--json",
        "--spec",
        f"eagle:{head_dirs['eagle-perturbed']},topk=2,depth=3",
        "--k",
        "6",
    )
    assert code == 0 and '"target_forwards"' in out
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *STORIES, "--spec", f"medusa:{tmp_path}/missing")
    assert_one_error_line(code, err, "is not a draft-head directory")
    code, _, err = run_cli(capsys, "serve", *STORIES, "--spec", f"eagle:{tmp_path}/missing")
    last = err.strip().splitlines()[-1]  # after the load's progress line
    assert code == 2 and last.startswith("speclm serve: error: ") and "is not a draft-head directory" in last


def test_bench_methods_keep_head_options_together():
    from speclm.cli.common import split_methods

    assert split_methods("ar, ngram,eagle:d/x,topk=1,depth=3,medusa:m,width=2,lookahead:3,2,2,lookahead") == [
        "ar",
        "ngram",
        "eagle:d/x,topk=1,depth=3",
        "medusa:m,width=2",
        "lookahead:3,2,2",
        "lookahead",
    ]


def test_head_sampling_runs_and_is_reproducible(stories_llm, head_dirs):
    """Sampled runs with top-k/top-p (exactness itself: tests/speculative/test_tree_exactness.py). Fixed K:
    adaptive K follows measured timings, which changes the drafts and so the random stream."""
    llm = stories_llm.with_spec(
        f"eagle:{head_dirs['eagle-perturbed']},topk=3,beam=2", num_speculative_tokens=6, adaptive=False
    )
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3, max_tokens=30)
    first, second = llm.generate("Once upon a time", params)[0], llm.generate("Once upon a time", params)[0]
    assert first.token_ids == second.token_ids and len(first.token_ids) > 0


def test_heads_in_bf16_run_quantized_and_stay_exact(head_dirs):
    """With --weights bf16 the heads' layers run in bf16 too (cheaper drafts); output still equals plain greedy."""
    from speclm import LLM
    from speclm.models.quant_linear import BF16Linear
    from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, weights="bf16")
    expected = llm.generate("Once upon a time", PARAMS)[0].token_ids
    for spec in (
        f"eagle:{head_dirs['eagle-perturbed']},topk=3",
        f"eagle:{head_dirs['eagle']},topk=1",
        f"medusa:{head_dirs['medusa-perturbed']}",
    ):
        fast = llm.with_spec(spec, num_speculative_tokens=6, adaptive=False)
        proposer = fast.proposers(fast.spec)
        assert any(
            isinstance(m, BF16Linear) for m in proposer.__dict__["head" if "eagle" in spec else "heads"].modules()
        )
        assert fast.generate("Once upon a time", PARAMS)[0].token_ids == expected, spec


def test_sampled_eagle_chain_carries_its_draft_distribution(stories_llm, head_dirs):
    """At temperature > 0 an EAGLE chain draws from its processed q (zero outside the token_map)."""
    llm = stories_llm.with_spec(
        f"eagle:{head_dirs['eagle-perturbed']},topk=1", num_speculative_tokens=4, adaptive=False
    )
    proposer = llm.proposers(llm.spec)
    ids = stories_llm.tokenizer.encode("Once upon a time")
    proposer.start(ids, 64)
    hidden = ContiguousPass(stories_llm.model, 64).hidden(ids[:-1], 0)
    proposer.add_features(hidden)
    params = SamplingParams(temperature=0.9, top_k=50)
    proposal = proposer.propose(ids, 4, params, torch.Generator().manual_seed(0))
    assert proposal.parents == [-1, 0, 1, 2] and proposal.probs.shape == (4, stories_llm.model.config.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(4))
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens))
    outside = torch.ones(proposal.probs.shape[1], dtype=torch.bool)
    outside[proposer.token_map] = False
    assert proposal.probs[:, outside].sum() == 0 and int((proposal.probs > 0).sum(-1).max()) <= 50  # top-k applied
