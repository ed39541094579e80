"""The target's logits of one verification pass's rows, computed together or one row at a time on demand."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from speclm.sample.masked import mask_logits
from speclm.sample.penalties import penalize
from speclm.sample.sampler import processed_probs, select_tokens
from speclm.sampling_params import SamplingParams


class RowLogits:
    """Rows of target logits (row 0 = the pending token, row 1+i = draft node i). Either computed in the
    batched forward (`computed`: [rows, vocab]), or one row at a time when first asked for (`on_demand`:
    a big tree's walk needs its path's rows only). The runner makes them, the sampler and the verifier
    read them through the same methods. `seconds`: time spent computing rows on demand."""

    def __init__(
        self,
        logits: torch.Tensor | None,
        compute_row: Callable[[int], torch.Tensor] | None,
        argmax: torch.Tensor | None = None,
        to_host: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        self._logits = logits  # [rows, vocab], or None when rows are computed on demand
        self._argmax = argmax  # [rows] on the host when the forward took the argmax where the logits lie
        self._to_host = to_host  # these rows' host copy (a step's logits are copied once for all its chunks)
        self._compute_row = compute_row
        self._rows: dict[int, torch.Tensor] = {}
        self.seconds = 0.0

    @classmethod
    def computed(
        cls,
        logits: torch.Tensor,
        argmax: torch.Tensor | None = None,
        to_host: Callable[[], torch.Tensor] | None = None,
    ) -> RowLogits:
        """Rows the forward already computed: [rows, vocab], on the host or on a GPU (copied to the host,
        by `to_host()` if given, when a read needs more than their argmax). `argmax` [rows] (host): each
        row's argmax, taken on the GPU (ModelOutput.argmax), so a greedy step copies no logits."""
        return cls(logits, None, argmax, to_host)

    def _host(self) -> torch.Tensor:
        """The computed rows on the host (copied once, when first needed)."""
        if self._logits.device.type != "cpu":
            self._logits = self._to_host() if self._to_host is not None else self._logits.cpu()
        return self._logits

    @classmethod
    def on_demand(cls, compute_row: Callable[[int], torch.Tensor]) -> RowLogits:
        """Rows computed (once each) by compute_row(row) -> [vocab] when first asked for."""
        return cls(None, compute_row)

    def masked(self, masks: torch.Tensor) -> RowLogits:
        """These rows under a grammar: row r's disallowed tokens (masks [rows, vocab] False) at -inf. A
        row with no allowed token (a dead end) is left unmasked: whatever is drawn there, the matcher
        refuses it and the engine ends the request."""
        dead = ~masks.numpy().any(-1) if masks.device.type == "cpu" else ~masks.any(-1)  # (numpy: see mask_logits)
        if dead.any():
            masks = masks.clone()
            masks[torch.as_tensor(dead)] = True
        if self._logits is not None:
            return RowLogits.computed(mask_logits(self._host(), masks[: self._logits.shape[0]]))
        masked = RowLogits.on_demand(lambda row: mask_logits(self.row(row), masks[row]))
        return masked

    def penalized(
        self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int], paths: list[list[int]]
    ) -> RowLogits:
        """These rows under the request's penalties (speclm/sample/penalties.py): row r with the output so
        far plus paths[r], the drafts on its path (row 0: none)."""
        if self._logits is not None:
            host = self._host()[: len(paths)]
            return RowLogits.computed(penalize(host, params, prompt_ids, output_ids, paths))
        return RowLogits.on_demand(
            lambda row: penalize(self.row(row)[None], params, prompt_ids, output_ids, [paths[row]])[0]
        )

    def row(self, row: int) -> torch.Tensor:
        """Logits of one row, [vocab]."""
        if self._logits is not None:
            return self._host()[row]
        if row not in self._rows:
            t0 = time.perf_counter()
            self._rows[row] = self._compute_row(row)
            self.seconds += time.perf_counter() - t0
        return self._rows[row]

    def sample_first(self, params: SamplingParams, generator: torch.Generator | None) -> int:
        """A plain draw (argmax when greedy) from row 0, the pending token's logits."""
        if params.greedy and self._argmax is not None:
            return int(self._argmax[0])
        first = self._host()[:1] if self._logits is not None else self.row(0)[None]  # [1, vocab]
        return int(select_tokens(first, params, generator)[0])

    def argmax_of(self) -> Callable[[int], int]:
        """row -> the argmax token (computed rows: one argmax call for all of them)."""
        if self._argmax is not None:
            return self._argmax.tolist().__getitem__
        if self._logits is not None:
            return self._host().argmax(-1).tolist().__getitem__
        return lambda row: int(self.row(row).argmax())

    def probs_of(self, params: SamplingParams) -> Callable[[int], torch.Tensor]:
        """row -> the processed target distribution p [vocab] (computed rows: one call for all of them)."""
        if self._logits is not None:
            return processed_probs(self._host(), params).__getitem__
        return lambda row: processed_probs(self.row(row)[None], params)[0]
