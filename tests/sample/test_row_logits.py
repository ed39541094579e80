"""RowLogits with an argmax taken where the logits lie (a GPU's static step): greedy reads come from it and
copy no logits; every other read (a sampled draw, a grammar's mask, probabilities) uses the logits."""

from __future__ import annotations

import torch

from speclm.sample.row_logits import RowLogits
from speclm.sampling_params import SamplingParams

GREEDY = SamplingParams()


class CountingTensor:
    """Stands in for logits on a GPU: counts the copies to the host."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits, self.copies = logits, 0
        self.device, self.shape = torch.device("meta"), logits.shape

    def cpu(self) -> torch.Tensor:
        self.copies += 1
        return self.logits


def test_a_greedy_read_takes_the_given_argmax_without_copying_the_logits():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    device = CountingTensor(logits)
    # The given argmax differs from the logits' on purpose: the greedy reads must come from it.
    rows = RowLogits.computed(device, torch.tensor([2, 1]))
    assert rows.sample_first(GREEDY, None) == 2
    assert [rows.argmax_of()(r) for r in range(2)] == [2, 1]
    assert device.copies == 0


def test_every_other_read_copies_the_logits_once():
    logits = torch.tensor([[0.0, 30.0, 1.0], [20.0, 0.0, 1.0]])
    device = CountingTensor(logits)
    rows = RowLogits.computed(device, torch.tensor([0, 0]))  # (not the logits' argmax: never read here)
    sampled = SamplingParams(temperature=1.0)
    assert rows.sample_first(sampled, torch.Generator().manual_seed(0)) == 1  # (30 against 0 and 1)
    assert torch.equal(rows.probs_of(sampled)(1), torch.softmax(logits[1], -1))
    assert torch.equal(rows.row(0), logits[0])
    masked = rows.masked(torch.tensor([[True, False, True], [True, True, True]]))
    assert masked.sample_first(GREEDY, None) == 2  # under the mask: the logits' argmax, not the given one
    assert device.copies == 1
