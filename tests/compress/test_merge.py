"""Merging: self-merges are identities, TIES/DARE/SLERP properties, YAML configs and clear errors."""

import math

import pytest
import torch
import yaml

from speclm.cli import main
from speclm.compress import merge
from speclm.compress.merge_config import MergeConfig
from speclm.compress.model_io import load_with_tokenizer, model_to_tensors, rebuild
from speclm.compress.save import save_checkpoint
from speclm.models.loader import load_checkpoint
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

GEN = torch.Generator().manual_seed(0)
A, B, C = (torch.randn(6, 8, generator=GEN) for _ in range(3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda: merge.linear([A, A, A], [0.2, 0.3, 0.5]),
        lambda: merge.task_arithmetic(A, [A, A], [1.0, 0.5]),
        lambda: merge.ties(A, [A, A], [1.0, 1.0], density=0.5),
        lambda: merge.dare(A, [A, A], [0.5, 0.5], 0.3, torch.Generator().manual_seed(1)),
        lambda: merge.dare(A, [A, A], [0.5, 0.5], 0.3, torch.Generator().manual_seed(1), use_ties=True),
        lambda: merge.slerp(A, A, 0.3),
    ],
)
def test_merging_a_tensor_with_itself_returns_it(fn):
    torch.testing.assert_close(fn(), A, rtol=1e-6, atol=1e-6)


def test_ties_trims_elects_sign_and_averages_only_agreeing_deltas():
    base = torch.zeros(5)
    t1 = torch.tensor([3.0, -1.0, 0.1, 2.0, -4.0])
    t2 = torch.tensor([1.0, 2.0, -0.2, -5.0, -2.0])
    assert merge.trim(t1, 0.4).tolist() == [3.0, 0.0, 0.0, 0.0, -4.0]
    # density 1 (no trim): entry 1 elects + (sum 1) -> only 2.0; entry 2 elects - -> only -0.2; entry 3 -> only -5
    out = merge.ties(base, [t1, t2], [1.0, 1.0], density=1.0)
    torch.testing.assert_close(out, torch.tensor([2.0, 2.0, -0.2, -5.0, -3.0]))
    # trimmed to the top 60%: t1 keeps 3, 2, -4; t2 keeps 2, -5, -2
    out = merge.ties(base, [t1, t2], [1.0, 1.0], density=0.6)
    torch.testing.assert_close(out, torch.tensor([3.0, 2.0, 0.0, -5.0, -3.0]))


def test_dare_keeps_about_density_and_preserves_the_delta_in_expectation():
    delta = torch.full((200_000,), 0.5)
    dropped = merge.dare_drop(delta, 0.2, torch.Generator().manual_seed(0))
    kept = (dropped != 0).float().mean().item()
    assert abs(kept - 0.2) < 4 * math.sqrt(0.2 * 0.8 / delta.numel())  # 4 sigma binomial bound
    assert torch.all((dropped == 0) | (dropped == 2.5))  # survivors rescaled by 1/density
    assert abs(dropped.mean().item() - 0.5) < 0.01
    same = merge.dare_drop(delta, 0.2, torch.Generator().manual_seed(0))
    assert torch.equal(dropped, same)  # seeded


def test_slerp_endpoints_and_great_circle():
    torch.testing.assert_close(merge.slerp(A, B, 0.0), A)
    torch.testing.assert_close(merge.slerp(A, B, 1.0), B)
    x, y = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    mid = merge.slerp(x, y, 0.5)
    torch.testing.assert_close(mid, torch.tensor([1.0, 1.0]) / math.sqrt(2))  # unit norm kept, unlike lerp
    third = merge.slerp(x, y, 1 / 3)
    torch.testing.assert_close(third, torch.tensor([math.cos(math.pi / 6), math.sin(math.pi / 6)]))


@pytest.fixture(scope="module")
def stories_dirs(tmp_path_factory):
    """The stories model saved twice: as is, and with perturbed weights (a 'fine-tune')."""
    checkpoint, tokenizer = load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)
    root = tmp_path_factory.mktemp("merge")
    tensors = model_to_tensors(rebuild(checkpoint))
    save_checkpoint(str(root / "base"), checkpoint.config, tensors, tokenizer)
    g = torch.Generator().manual_seed(0)
    tuned = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in tensors.items()}
    save_checkpoint(str(root / "tuned"), checkpoint.config, tuned, tokenizer)
    return root


@pytest.mark.parametrize(
    "method,params",
    [
        ("linear", {}),
        ("ties", {"density": 0.5}),
        ("dare_ties", {"density": 0.5}),
        ("slerp", {"t": 0.4}),
        ("task_arithmetic", {}),
    ],
)
def test_merging_the_stories_model_with_itself_via_yaml_returns_it(stories_dirs, tmp_path, method, params):
    base = str(stories_dirs / "base")
    config = {
        "merge_method": method,
        "base_model": base,
        "parameters": params,
        "models": [{"model": base, "parameters": {"weight": 0.5}}, {"model": base, "parameters": {"weight": 0.5}}],
    }
    (tmp_path / "merge.yaml").write_text(yaml.safe_dump(config))
    assert main(["merge", "--config", str(tmp_path / "merge.yaml"), "--out", str(tmp_path / "out")]) == 0
    merged, original = load_checkpoint(str(tmp_path / "out")), load_checkpoint(base)
    for name, t in original.tensors.items():
        torch.testing.assert_close(merged.tensors[name], t, rtol=1e-6, atol=1e-6)


def test_yaml_merge_of_two_models_is_the_tensorwise_result(stories_dirs, tmp_path):
    base, tuned = str(stories_dirs / "base"), str(stories_dirs / "tuned")
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump(
            {
                "merge_method": "slerp",
                "base_model": base,
                "models": [{"model": base}, {"model": tuned}],
                "parameters": {"t": 0.25},
            }
        )
    )
    assert main(["merge", "--config", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "out")]) == 0
    a, b, m = (load_checkpoint(p) for p in (base, tuned, str(tmp_path / "out")))
    name = "model.layers.0.mlp.down_proj.weight"
    torch.testing.assert_close(m.tensors[name], merge.slerp(a.tensors[name], b.tensors[name], 0.25))


def test_incompatible_models_and_bad_configs_are_clear_errors(stories_dirs, tmp_path, capsys):
    checkpoint, tokenizer = load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)
    smaller = {k: v for k, v in model_to_tensors(rebuild(checkpoint)).items() if ".layers.4." not in k}
    config = checkpoint.config
    config.num_layers = 4
    save_checkpoint(str(tmp_path / "short"), config, smaller, tokenizer)
    (tmp_path / "m.yaml").write_text(
        yaml.safe_dump(
            {
                "merge_method": "linear",
                "models": [{"model": str(stories_dirs / "base")}, {"model": str(tmp_path / "short")}],
            }
        )
    )
    assert main(["merge", "--config", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "out")]) == 2
    assert "num_layers differs (4 vs 5)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="merge_method 'frankenmerge'"):
        MergeConfig.from_dict({"merge_method": "frankenmerge", "models": ["a"]})
    with pytest.raises(ValueError, match="ties needs base_model"):
        MergeConfig.from_dict({"merge_method": "ties", "models": ["a", "b"]})
    with pytest.raises(ValueError, match="density"):
        MergeConfig.from_dict(
            {"merge_method": "dare_linear", "base_model": "a", "models": ["b"], "parameters": {"density": 0}}
        )
