"""The interface of layers whose inference forward is also a plain closure (LayerOps, lean decoding)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class OpModule(nn.Module):
    """A layer that hands out its forward as op(): a closure over its tensors, without nn.Module
    dispatch and attribute lookups per call. The closure does not see the layer replaced or hooked later."""

    def op(self) -> Callable[[torch.Tensor], torch.Tensor]:
        raise NotImplementedError
