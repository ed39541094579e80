"""Which weight bytes a GPU decoding pass brings into L2 ahead of the GEMMs that read them, and when.

At the start of each layer a side stream forks from the pass and prefetches, for that layer, the items of a
plan: while the main stream runs the latency-bound attention block (norm, qkv, rotary, attention, o), the bus
fetches the MLP's first bytes, so gate_up's GEMM finds them in L2. The side stream joins the pass at its end
(a CUDA graph captures the fork and the join). A plan: `MODE:ITEM+ITEM...[/ITEM+ITEM...]`, MODE as in
speclm/kernels/triton_prefetch.py, an ITEM a projection (qkv, o, gate_up, down), `n` after it for the next
layer's, then how many MB of it from its start (all of it without a number); items after `/` fork after the
attention block instead: e.g. `bulk:o+gate_up24/down16+qkvn`.
"""

from __future__ import annotations

import re

import torch

PROJECTIONS = {"qkv": ("self_attn", "qkv_proj"), "o": ("self_attn", "o_proj"), "gate_up": ("mlp", "gate_up_proj")}
PROJECTIONS["down"] = ("mlp", "down_proj")
ITEM = re.compile(r"(qkv|o|gate_up|down)(n?)(\d*)")
MAX_ROWS = 32  # passes of more rows (prompts) are compute-bound: no prefetch


def parse_plan(plan: str) -> tuple[str, list[tuple[str, int, int | None, bool]]]:
    """(mode, [(projection, layer offset, bytes or None for all, after the attention block)]) of a plan."""
    mode, _, items = plan.partition(":")
    start, _, mid = items.partition("/")
    parsed = []
    for item in start.split("+") + (mid.split("+") if mid else []):
        m = ITEM.fullmatch(item)
        if m is None:
            raise ValueError(f"prefetch plan {plan!r}: bad item {item!r} (e.g. o, gate_up24, qkvn)")
        nbytes = int(m.group(3)) << 20 if m.group(3) else None
        parsed.append((m.group(1), 1 if m.group(2) else 0, nbytes, len(parsed) >= len(start.split("+"))))
    return mode, parsed


class WeightPrefetch:
    """A plan bound to a model's layers: `layer(i)` and `mid(i)` fork layer i's prefetches, `join()` ends them."""

    def __init__(self, layers, plan: str) -> None:
        self.plan = plan
        self.mode, items = parse_plan(plan)
        device = layers[0].input_layernorm.weight.device
        self.stream = torch.cuda.Stream(device)
        self.sink = torch.zeros(1 << 16, dtype=torch.int32, device=device)
        self.at_start, self.at_mid = [], []
        for i in range(len(layers)):
            start, mid = [], []
            for name, offset, nbytes, later in items:
                if i + offset < len(layers):
                    block, attr = PROJECTIONS[name]
                    w = getattr(getattr(layers[i + offset], block), attr).weight
                    (mid if later else start).append((w, w.numel() * w.element_size() if nbytes is None else nbytes))
            self.at_start.append(start)
            self.at_mid.append(mid)
        self.forked = False

    def layer(self, i: int) -> None:
        self._fork(self.at_start[i])

    def mid(self, i: int) -> None:
        self._fork(self.at_mid[i])

    def _fork(self, ranges) -> None:
        if not ranges:
            return
        from speclm.kernels.triton_prefetch import prefetch_l2

        main = torch.cuda.current_stream()
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            for w, nbytes in ranges:
                prefetch_l2(w, nbytes, self.sink, self.mode)
        self.forked = True

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream().wait_stream(self.stream)
            self.forked = False
