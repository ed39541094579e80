"""Held-out validation for drafter training: the split is disjoint and seeded, and the trainer ends
with (and run_distill saves) the state that scored best on the held-out sequences."""

import pytest
import torch
from torch import nn

from speclm.distill.data import DataSettings, TargetData, split_sequences
from speclm.distill.run import DistillOptions, prepare, run_distill
from speclm.distill.trainer import TrainConfig, Trainer
from speclm.speculative.heads import load_head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_split_is_disjoint_covering_and_seeded():
    train, val = split_sequences(100, 0.05, seed=0)
    assert len(val) == 5 and sorted(train + val) == list(range(100))
    assert (train, val) == split_sequences(100, 0.05, seed=0)
    assert val != split_sequences(100, 0.05, seed=1)[1]
    assert split_sequences(10, 0.01, seed=0)[1] != [] and split_sequences(10, 0.0, seed=0) == (list(range(10)), [])
    with pytest.raises(ValueError, match="--val-fraction"):
        split_sequences(10, 1.0, seed=0)


def test_subset_keeps_whole_sequences():
    lengths, hidden = [3, 5, 2, 4], 6
    offsets = torch.tensor([0, 3, 8, 10, 14])
    data = TargetData(
        torch.arange(14),
        torch.randn(14, hidden).bfloat16(),
        offsets,
        torch.tensor([1, 2, 1, 3]),
        torch.ones(20, dtype=torch.long),
    )
    part = data.subset([1, 3])
    assert len(part) == 2 and part.offsets.tolist() == [0, lengths[1], lengths[1] + lengths[3]]
    for j, i in enumerate([1, 3]):
        for mine, theirs in zip(part.sequence(j), data.sequence(i)):
            assert torch.equal(torch.as_tensor(mine), torch.as_tensor(theirs))


class Scripted:
    """A one-parameter objective whose validation scores are given in advance; it records the
    weight each validation saw."""

    def __init__(self, scores):
        self.module, self.scores, self.seen = nn.Linear(1, 1, bias=False), list(scores), []

    def loss(self, generator):
        return (self.module.weight - 5.0).pow(2).sum(), {}

    def validate(self):
        self.seen.append(float(self.module.weight.detach()))
        return self.scores.pop(0)


def test_trainer_ends_with_the_best_validated_state(tmp_path):
    objective = Scripted([0.2, 0.6, 0.4, 0.5])  # steps 2, 4, 6 and the end (7)
    config = TrainConfig(steps=7, lr=0.1, warmup_steps=0, checkpoint_every=0, eval_every=2)
    result = Trainer(objective, config, str(tmp_path)).train()
    assert [s for s, _ in result.evals] == [2, 4, 6, 7] and result.best_step == 4
    assert len(set(objective.seen)) == 4  # the weight moved between validations
    assert float(objective.module.weight.detach()) == objective.seen[1]
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)  # resuming continues from the last step
    assert saved["step"] == 7 and float(saved["module"]["weight"]) == objective.seen[-1] and saved["best"][0] == 4


def test_eagle_run_saves_the_best_held_out_head(stories_llm, tmp_path):
    train = TrainConfig(steps=6, lr=3e-3, warmup_steps=2, checkpoint_every=0, eval_every=2)
    opts = DistillOptions(
        "eagle",
        str(tmp_path / "eagle"),
        weights="fp32",
        data_dir=str(tmp_path.parent / "data"),
        data=DataSettings(max_new_tokens=24, chat=False, batch_size=16),
        batch_size=2,
        token_map_size=300,
        val_fraction=0.1,
        train=train,
    )
    summary = run_distill(opts, stories_llm)
    evals = dict(summary["val_agree"])
    assert list(evals) == [2, 4, 6] and evals[summary["best_step"]] == summary["best_val_agree"] == max(evals.values())
    prepared = prepare(opts, stories_llm)  # the same split: scoring the saved head gives its recorded score
    assert summary["val_sequences"] == prepared.num_validation > 0
    prepared.objective.head.load_state_dict(load_head(opts.out).state_dict())
    assert round(prepared.objective.validate(), 4) == summary["best_val_agree"]
    with pytest.raises(ValueError, match="--val-fraction"):
        DistillOptions("medusa", "x", val_fraction=0.1)
