"""Attention, in one place: rows computed like plain decoding (the speculative exactness and batch
invariance rest on it), the metadata of a pass over one contiguous cache or over a paged batch, and
grouped-query self-attention with its fused rotary write into the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import NamedTuple

import torch
import torch.nn.functional as F

from speclm.kernels import cpu_kernels
from speclm.models.gpu_attention import GpuBatchPlan, attend_decode_rows
from speclm.models.rope import apply_rope

TensorFn = Callable[[torch.Tensor], torch.Tensor]  # a linear layer or a norm, as a callable


class DecodeRows(NamedTuple):
    """Query rows attended like plain decoding. Row i reads lengths[i] keys: the slots
    slots[r, :lengths[i]] of the key tensor with r = slot_rows[i] (or i when slot_rows is None)
    when slots is given, else its first lengths[i] keys. Rows of one causal chunk share a table row."""

    lengths: torch.Tensor  # [n] int64
    slots: torch.Tensor | None = None  # [table rows, >= max(lengths)] int64
    slot_rows: torch.Tensor | None = None  # [n] int64

    @classmethod
    def causal(cls, total: int, n: int, device: torch.device | str = "cpu") -> DecodeRows:
        """The last n of `total` keys' rows, each over its causal prefix (prompt, decode, verification rows)."""
        return cls(torch.arange(total - n + 1, total + 1, device=device))

    @classmethod
    def tree(cls, start: int, paths: list[list[int]], device: torch.device | str = "cpu") -> DecodeRows:
        """Token-tree rows written at slots start..: each reads slots 0..start-1, then its path."""
        depth = max(len(p) for p in paths)
        slots = torch.arange(start + depth).repeat(len(paths), 1)
        for i, path in enumerate(paths):
            slots[i, start : start + len(path)] = torch.tensor(path) + start
        return cls(torch.tensor([start + len(p) for p in paths]), slots).to(device)

    def to(self, device: torch.device | str) -> DecodeRows:
        return DecodeRows(*(None if t is None else t.to(device) for t in self))

    def windowed(self, window: int) -> DecodeRows:
        """These rows over their last `window` keys only (a sliding-window layer's): a row's keys are
        in position order, so its window is the tail of its slots."""
        lengths = self.lengths.clamp(max=window)
        if bool((lengths == self.lengths).all()):
            return self
        n, device = len(self.lengths), self.lengths.device
        table_rows = torch.arange(n, device=device) if self.slot_rows is None else self.slot_rows
        index = (self.lengths - lengths)[:, None] + torch.arange(window, device=device)  # [n, window]
        index = torch.minimum(index, (self.lengths - 1).clamp(min=0)[:, None])  # (short rows: padding repeats)
        slots = index if self.slots is None else self.slots[table_rows[:, None], index]
        return DecodeRows(lengths, slots, torch.arange(n, device=device))


def decode_kernels(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> ModuleType | None:
    """speclm's compiled kernels when they apply to t (CPU, `dtype`, no gradient wanted), else None."""
    if t.device.type != "cpu" or t.dtype != dtype or (t.requires_grad and torch.is_grad_enabled()):
        return None
    return cpu_kernels()


def attend_like_decoding(
    q: torch.Tensor,  # [heads, n, head_dim]
    keys: torch.Tensor,  # [kv_heads, num_slots, head_dim]
    values: torch.Tensor,
    rows: DecodeRows,
) -> torch.Tensor:
    """Attention for rows whose results must not depend on the rest of the pass: each row is computed
    exactly as plain decoding computes that token once its keys are in the cache, whatever the other
    rows. speclm's CPU kernel does that in one call; without it, each row makes the one-query SDPA
    call plain decoding makes (one SDPA call over many rows accumulates in another order). On a GPU a
    Triton kernel reads each row's keys in place (speclm/models/gpu_attention.py). Returns
    [heads, n, head_dim]."""
    if q.device.type == "cuda":
        return attend_decode_rows(q, keys, values, rows.lengths, rows.slots, rows.slot_rows)
    kernels = decode_kernels(q)
    if kernels is not None:
        empty = rows.lengths[:0]
        return kernels.attend_rows(
            q,
            keys,
            values,
            rows.lengths,
            empty if rows.slots is None else rows.slots,
            empty if rows.slot_rows is None else rows.slot_rows,
            q.shape[-1] ** -0.5,
        )
    gqa, out = q.shape[0] != keys.shape[0], []
    table_rows = range(len(rows.lengths)) if rows.slot_rows is None else rows.slot_rows.tolist()
    for i, (length, r) in enumerate(zip(rows.lengths.tolist(), table_rows)):
        index = slice(0, length) if rows.slots is None else rows.slots[r, :length]
        out.append(
            F.scaled_dot_product_attention(
                q[None, :, i : i + 1], keys[None, :, index], values[None, :, index], enable_gqa=gqa
            )[0]
        )
    return torch.cat(out, dim=1)


@dataclass
class AttentionMetadata:
    """A pass over one sequence's contiguous cache (draft models, heads, training): the new tokens
    occupy slots [start, start + num_tokens). `mask` ([num_tokens, start + num_tokens], True = may
    attend) is None for the usual causal case. `paths` (per new row, the new rows from the first down
    to itself) marks a token-tree pass: each row attends to the prefix and its path only.
    Rows after a prefix and tree rows attend like decoding; a prompt from slot 0 or a mask runs one
    SDPA call (what training differentiates through)."""

    start: int
    num_tokens: int
    mask: torch.Tensor | None = None
    paths: list[list[int]] | None = None
    _rows: DecodeRows | None = field(default=None, init=False, repr=False)  # built once, used by every layer
    _slots: torch.Tensor | None = field(default=None, init=False, repr=False)
    _windowed: dict = field(default_factory=dict, init=False, repr=False)  # window -> DecodeRows

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def max_position(self) -> None:
        """Unknown here: the caller's positions need not be start.. (a draft's tree)."""
        return None

    @property
    def local(self) -> None:
        """The metadata of sliding-window layers that have a pool of their own: none on a contiguous cache."""
        return None

    def sdpa_mask(self) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal) arguments for scaled_dot_product_attention."""
        if self.mask is not None:
            return self.mask, False
        if self.num_tokens == 1:
            return None, False
        if self.start == 0:
            return None, True
        q_pos = torch.arange(self.start, self.end).unsqueeze(1)
        k_pos = torch.arange(self.end).unsqueeze(0)
        return k_pos <= q_pos, False

    def decode_rows(self, device: torch.device, prompt_too: bool = False) -> DecodeRows | None:
        """The rows' DecodeRows when they attend like decoding, else None (one SDPA call). With
        `prompt_too`, a prompt from slot 0 attends like decoding as well (the native decoder: no gradients)."""
        first_rows = self.start > 0 or self.num_tokens == 1 or prompt_too
        like_decoding = self.paths is not None or (self.mask is None and first_rows)
        if self._rows is None and like_decoding:
            self._rows = (
                DecodeRows.causal(self.end, self.num_tokens, device)
                if self.paths is None
                else DecodeRows.tree(self.start, self.paths, device)
            )
        return self._rows

    def write_slots(self, device: torch.device) -> torch.Tensor:
        """The cache slot of each new token, [num_tokens]."""
        if self._slots is None:
            self._slots = torch.arange(self.start, self.end, device=device)
        return self._slots

    def attend_cached(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        """Attention of the new rows q [heads, num_tokens, head_dim] once their keys/values are in the cache;
        with `window`, each row over its last `window` keys (itself included)."""
        if window is not None and window < self.end:
            if self.mask is not None:
                raise ValueError("sliding-window attention with an explicit mask is not supported")
            if window not in self._windowed:
                self._windowed[window] = self.decode_rows(q.device, prompt_too=True).windowed(window)
            return attend_like_decoding(q, k_cache, v_cache, self._windowed[window])
        rows = self.decode_rows(q.device)
        if rows is not None:
            return attend_like_decoding(q, k_cache, v_cache, rows)
        attn_mask, is_causal = self.sdpa_mask()
        return F.scaled_dot_product_attention(
            q.unsqueeze(0),
            k_cache[:, : self.end].unsqueeze(0),
            v_cache[:, : self.end].unsqueeze(0),
            attn_mask=attn_mask,
            is_causal=is_causal,
            enable_gqa=q.shape[0] != k_cache.shape[0],
        )[0]


@dataclass
class BatchEntry:
    """One sequence's part of a batched step: new tokens at positions start.., the cache slots of
    its tokens 0..start+len(tokens)-1 (minus any a StreamingLLM window dropped; the new tokens'
    slots are the last ones), and how many trailing rows need logits. `local_slots`: the same in the
    pool of sliding-window layers when they have one (speclm/kv/hybrid.py), where only a suffix is held.

    `row_paths` marks a token-tree verification (speclm/sample/tree.py): tokens are the pending token
    then the tree's nodes, row r (written at the slot of position start + r) sits at position
    start + its depth and attends to the prefix and its path only (rows from 0 down to itself)."""

    tokens: list[int]
    start: int
    slots: list[int]
    num_logits: int
    row_paths: list[list[int]] | None = None
    local_slots: list[int] | None = None

    def positions(self) -> list[int]:
        """The rotary position of every new token."""
        if self.row_paths is None:
            return list(range(self.start, self.start + len(self.tokens)))
        return [self.start + len(path) - 1 for path in self.row_paths]


class PagedAttentionMetadata:
    """Where a batched step's flattened tokens go in the paged cache and what each may attend to.

    Every row attends on its own, like decoding (attend_like_decoding): prompt rows, decode rows,
    verification and token-tree rows alike read their sequence's slots in order, the arithmetic of
    plain decoding for that token. So a row's result does not depend on what else shares the step,
    on how its prompt was chunked, on which blocks came from the prefix cache, or on whether it is
    recomputed after a preemption: a request's output is the same under any load.

    On a GPU, `prompt_sdpa` lets a prompt that starts its sequence run as one fused SDPA call instead
    (faster prefill), at the cost of that promise in half precision: the same row computed by SDPA and by
    the paged kernel rounds differently, so a prefix-cache hit (its prompt's tail rows then go through the
    kernel) could change a greedy token. The model runner turns it on only where batch invariance is off.
    """

    def __init__(
        self,
        entries: list[BatchEntry],
        device: torch.device | str = "cpu",
        queries: list[torch.Tensor] | None = None,
        prompt_sdpa: bool = False,
    ) -> None:
        self.prompt_sdpa = prompt_sdpa
        self.queries = queries  # when a list: each layer appends its rotated queries (H2O, SnapKV read them)
        self.slot_mapping = torch.tensor(
            [s for e in entries for s in e.slots[len(e.slots) - len(e.tokens) :]], dtype=torch.long, device=device
        )  # [num_tokens]
        # Per sequence: (its slots, its rows' DecodeRows over those slots) in row order.
        self.sequences: list[tuple[torch.Tensor, DecodeRows]] = []
        for e in entries:
            slots, n = torch.tensor(e.slots, dtype=torch.long, device=device), len(e.tokens)
            local = (
                DecodeRows.tree(len(e.slots) - n, e.row_paths, device)
                if e.row_paths is not None
                else DecodeRows.causal(len(e.slots), n, device)
            )
            self.sequences.append((slots, local))
        self.num_tokens = len(self.slot_mapping)
        # The largest rotary position of the step, known on the host (no read-back from a GPU).
        self.max_position = max((e.start + len(e.tokens) - 1 for e in entries), default=0)
        # Sliding-window layers with a pool of their own read and write its slots (their keys' order is the same).
        local = [replace(e, slots=e.local_slots, local_slots=None) for e in entries if e.local_slots is not None]
        assert not local or len(local) == len(entries)
        self.local = PagedAttentionMetadata(local, device, queries, prompt_sdpa) if local else None
        self._pooled: DecodeRows | None = None
        self._windowed: dict[int, DecodeRows] = {}  # window -> pooled rows over their windows
        self._gpu_plan: GpuBatchPlan | None = None  # built by the first layer of a step on a GPU
        self._completes = [e.num_logits > 0 for e in entries]  # (which chunks end with a row that has logits)

    def pooled(self) -> DecodeRows:
        """Every row as one DecodeRows over pool slots: one table row per causal sequence (shared by
        its rows), one per tree row."""
        if self._pooled is None:
            lengths, tables, slot_rows, table_count = [], [], [], 0
            for slots, local in self.sequences:
                lengths.append(local.lengths)
                table = slots[None] if local.slots is None else slots[local.slots]  # [table rows, width]
                slot_rows.append(
                    torch.zeros_like(local.lengths) + table_count
                    if local.slots is None
                    else torch.arange(len(local.lengths), device=slots.device) + table_count
                )
                tables.append(table)
                table_count += table.shape[0]
            width = max(t.shape[1] for t in tables)
            table = torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tables])
            self._pooled = DecodeRows(torch.cat(lengths), table, torch.cat(slot_rows))
        return self._pooled

    def write_slots(self, device: torch.device) -> torch.Tensor:
        """The pool slot of each new token, [num_tokens]."""
        return self.slot_mapping

    def attend_cached(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        """Attention of all rows q [heads, num_tokens, head_dim] once their keys/values are in the pool;
        with `window`, each row over its last `window` keys (itself included)."""
        if self.queries is not None:
            self.queries.append(q)
        if isinstance(k_cache, torch.Tensor) and q.device.type == "cuda":  # rows in place (prompts by SDPA if asked)
            if self._gpu_plan is None:
                self._gpu_plan = GpuBatchPlan(self.sequences, q.device, self._completes, self.prompt_sdpa)
            return self._gpu_plan.attend(q, k_cache, v_cache, self.pooled, window)
        if isinstance(k_cache, torch.Tensor):  # one call reads the pool
            if window is None:
                return attend_like_decoding(q, k_cache, v_cache, self.pooled())
            if window not in self._windowed:
                self._windowed[window] = self.pooled().windowed(window)
            return attend_like_decoding(q, k_cache, v_cache, self._windowed[window])
        # int8 slots: each sequence's keys are gathered and dequantized, then attended like decoding
        out, row = torch.empty_like(q), 0
        for slots, local in self.sequences:
            n = len(local.lengths)
            rows = local if window is None else local.windowed(window)
            out[:, row : row + n] = attend_like_decoding(
                q[:, row : row + n], k_cache[:, slots], v_cache[:, slots], rows
            )
            row += n
        return out


def attention_weights(q: torch.Tensor, keys: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Softmax attention weights of query rows q [..., heads, n, head_dim] over keys [..., kv_heads, width,
    head_dim] (leading dims: e.g. layers), row i over the first lengths[i] keys, summed over the query
    heads of each KV head: [..., kv_heads, n, width] fp32, 0 past a row's length. KV eviction (H2O,
    SnapKV) ranks tokens by them; the decoding kernels never form them, so runs without those
    policies do not pay for them."""
    *lead, heads, n, head_dim = q.shape
    kv, width = keys.shape[-3], keys.shape[-2]
    grouped = q.reshape(*lead, kv, heads // kv * n, head_dim)
    logits = torch.matmul(grouped, keys.transpose(-1, -2)).view(*lead, kv, heads // kv, n, width) * head_dim**-0.5
    if min(lengths) < width:
        past = torch.arange(width) >= torch.tensor(lengths)[:, None]  # [n, width]
        logits = logits.masked_fill(past.to(logits.device), float("-inf"))
    return torch.softmax(logits.float(), dim=-1).sum(-3)


def rope_kernels(qkv: torch.Tensor, cos: torch.Tensor, k_cache) -> ModuleType | None:
    """speclm's kernels when rope_qkv can take this QKV output (CPU, fp32 or bf16, no gradient) and
    write into this cache (an fp32 tensor: not an int8 paged pool), else None."""
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype != torch.float32 or cos.dtype != torch.float32:
        return None
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        return None
    return decode_kernels(qkv, qkv.dtype) if qkv.dtype in (torch.float32, torch.bfloat16) else None


def gpu_rope_fits(qkv: torch.Tensor, cos: torch.Tensor, k_cache, head_dim: int) -> bool:
    """Whether rope_write (speclm/kernels/triton_ops.py) takes this step: CUDA tensors of one dtype, a
    tensor cache (not int8 slots), a power-of-two head_dim turned whole (no partial rotary), no gradient wanted."""
    if not qkv.is_cuda or not isinstance(k_cache, torch.Tensor) or qkv.requires_grad:
        return False
    same = qkv.dtype == cos.dtype == k_cache.dtype and qkv.dim() == 2 and qkv.stride(-1) == 1
    return same and cos.shape[-1] == head_dim and head_dim >= 2 and head_dim & (head_dim - 1) == 0


def self_attention(
    x: torch.Tensor,  # [num_tokens, hidden]: the normed input
    qkv_proj: TensorFn,
    o_proj: TensorFn,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [kv_heads, capacity, head_dim] (or Int8Slots)
    v_cache: torch.Tensor,
    meta: AttentionMetadata | PagedAttentionMetadata,
    window: int | None = None,
) -> torch.Tensor:
    """Grouped-query self-attention with a fused QKV projection and an external KV cache. Attention runs
    in the cache's dtype (LlamaModel.attn_dtype), rotary included; o_proj gets the layer's dtype back.
    `window`: each row attends to its last `window` keys only (a sliding-window layer)."""
    n, h, kv = x.shape[0], num_heads, num_kv_heads
    qkv = qkv_proj(x)
    kernels = rope_kernels(qkv, cos, k_cache)
    if kernels is not None:  # one call: rotate, write keys/values to their slots, return q
        q = kernels.rope_qkv(qkv, cos, sin, h, kv, k_cache, v_cache, meta.write_slots(qkv.device))
    elif gpu_rope_fits(qkv, cos, k_cache, head_dim):  # the same in one Triton launch
        from speclm.kernels.triton_ops import rope_write

        q = rope_write(qkv, cos, sin, h, kv, k_cache, v_cache, meta.write_slots(qkv.device))
    else:
        if qkv.dtype != cos.dtype:
            qkv = qkv.to(cos.dtype)
        qkv = qkv.view(n, h + 2 * kv, head_dim).transpose(0, 1)  # [heads + 2 kv, n, d]
        qk = apply_rope(qkv[: h + kv], cos, sin)  # q and k rotated in one go
        slots = meta.write_slots(qkv.device)
        k_cache[:, slots] = qk[h:]
        v_cache[:, slots] = qkv[h + kv :]
        q = qk[:h]
    out = meta.attend_cached(q, k_cache, v_cache) if window is None else meta.attend_cached(q, k_cache, v_cache, window)
    out = out.transpose(0, 1).reshape(n, -1)
    return o_proj(out if out.dtype == x.dtype else out.to(x.dtype))
