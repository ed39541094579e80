"""Pruning masks, SparseGPT's reconstruction advantage, and a pruned real checkpoint that still generates."""

import json

import pytest
import torch

from speclm.compress.calibration import hessian
from speclm.compress.prune import PruneOptions, lowest_mask
from speclm.compress.sparsegpt import sparsegpt
from tests.compress.conftest import CALIBRATION, stories_command
from tests.compress.test_quantize import correlated_inputs


def test_nm_mask_prunes_exactly_n_of_every_m_lowest():
    metric = torch.tensor([[4.0, 1.0, 3.0, 2.0, 0.5, 0.7, 9.0, 8.0]])
    mask = lowest_mask(metric, PruneOptions("magnitude", prune_n=2, prune_m=4))
    assert mask.tolist() == [[False, True, False, True, True, True, False, False]]


def test_unstructured_mask_prunes_the_fraction_per_row():
    metric = torch.rand(8, 100, generator=torch.Generator().manual_seed(0))
    mask = lowest_mask(metric, PruneOptions("wanda", sparsity=0.3))
    assert mask.sum(dim=1).tolist() == [30] * 8
    assert bool(metric[mask].max() <= metric[~mask].max())


@pytest.mark.parametrize("n,m", [(0, 0), (2, 4)])
def test_sparsegpt_beats_magnitude_on_reconstruction(n, m):
    x = correlated_inputs(seed=4)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(5))
    options = PruneOptions("magnitude", 0.5, n, m)
    w_mag = w.masked_fill(lowest_mask(w.abs(), options), 0)
    w_sgpt = sparsegpt(w, hessian(x), 0.5, n, m)
    assert (w_sgpt == 0).float().mean() == pytest.approx(0.5, abs=1e-6)
    if m:
        assert bool(((w_sgpt == 0).view(64, -1, m).sum(-1) >= n).all())
    err = lambda wp: (x @ (w - wp).T).pow(2).mean()  # noqa: E731
    assert err(w_sgpt) < 0.5 * err(w_mag)


def test_bad_pruning_options_are_value_errors():
    with pytest.raises(ValueError, match="N:M"):
        PruneOptions("wanda", prune_n=4, prune_m=4)
    with pytest.raises(ValueError, match="sparsity"):
        PruneOptions("magnitude", sparsity=1.0)
    with pytest.raises(ValueError, match="unknown pruning method"):
        PruneOptions("random")


@pytest.mark.parametrize(
    "args", [["--method", "wanda", "--pattern", "2:4"], ["--method", "sparsegpt", "--sparsity", "0.5"]]
)
def test_pruned_stories_checkpoint_has_the_sparsity_and_still_generates(tmp_path, capsys, args):
    from safetensors.torch import load_file

    from speclm import LLM, SamplingParams

    out = tmp_path / "pruned"
    assert stories_command("prune", *args, "--out", str(out), *CALIBRATION) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sparsity"] == pytest.approx(0.5, abs=1e-6)
    tensors = load_file(str(out / "model.safetensors"))
    linears = [t for k, t in tensors.items() if k.endswith("proj.weight")]
    assert sum(int((t == 0).sum()) for t in linears) / sum(t.numel() for t in linears) == pytest.approx(0.5, abs=1e-6)
    assert (tensors["model.embed_tokens.weight"] != 0).all()  # embeddings are not pruned
    llm = LLM(str(out))  # tokenizer.json was written next to the weights
    text = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=24))[0].text
    words = text.split()
    assert len(words) >= 8 and all(w.isascii() for w in words), text  # still English-looking output
