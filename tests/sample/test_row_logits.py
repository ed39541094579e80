"""RowLogits with an argmax taken where the logits lie (a GPU's static step): greedy reads come from it and
copy no logits; every other read (a sampled draw, a grammar's mask, probabilities) uses the logits, copied
to the host once for all the chunks of the step."""

from __future__ import annotations

import torch

from speclm.engine.model_runner import ModelOutput
from speclm.sample.row_logits import RowLogits
from speclm.sampling_params import SamplingParams

GREEDY = SamplingParams()


class CountingTensor:
    """Stands in for logits on a GPU (and its slices): counts the copies to the host."""

    def __init__(self, logits: torch.Tensor, copies: list[int] | None = None) -> None:
        self.logits, self._copies = logits, copies if copies is not None else [0]
        self.device, self.shape = torch.device("meta"), logits.shape

    @property
    def copies(self) -> int:
        return self._copies[0]

    def __getitem__(self, index) -> CountingTensor:
        return CountingTensor(self.logits[index], self._copies)

    def cpu(self) -> torch.Tensor:
        self._copies[0] += 1
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


def test_the_chunks_of_a_step_share_one_copy_of_its_logits():
    logits = torch.tensor([[0.0, 30.0, 1.0], [20.0, 0.0, 1.0], [0.0, 1.0, 40.0]])
    device = CountingTensor(logits)
    out = ModelOutput(device, torch.zeros(3, 2), 0.0, None, torch.tensor([1, 0, 2]))
    chunks = [  # rows 0-1 (a verification) and row 2 (a decode), as OutputProcessor.process slices them
        RowLogits.computed(out.logits[a:b], out.argmax[a:b], lambda a=a, b=b: out.host_logits()[a:b])
        for a, b in ((0, 2), (2, 3))
    ]
    sampled, generator = SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    assert [rows.sample_first(sampled, generator) for rows in chunks] == [1, 2]
    assert torch.equal(chunks[0].row(1), logits[1]) and torch.equal(chunks[1].row(0), logits[2])
    assert device.copies == 1 and out.logits is logits  # one copy of the step's logits, for both chunks
