"""Attention on a GPU: rows that attend like decoding read the (paged) KV cache in place through a Triton
kernel (speclm/kernels/triton_attention.py), and a prompt that starts a sequence runs one causal
scaled_dot_product_attention call (torch picks its fused backend: FlashAttention where it applies).

The row interface is the CPU kernel's `attend_rows` (speclm/models/attention.py, DecodeRows): row i reads
the keys at slots table[table_rows[i], :lengths[i]], in that order. A paged pool's rows get their table
from the block manager's slots, so a decode or verification row reads its sequence's blocks where they
lie, and a token-tree row reads the prefix then its own path: no contiguous copy of the cache is made.
`attend_rows_reference` is the same interface in plain torch: the CPU tests check it against speclm's
CPU attention, the GPU tests check the Triton kernel against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per sequence above which a prompt that starts its sequence runs as one SDPA call rather than as
# decoding rows (the kernel's programs each take one row: made for few rows over many keys).
PREFILL_SDPA_MIN_ROWS = 2


def attend_rows_reference(
    q: torch.Tensor,  # [heads, n, head_dim]
    keys: torch.Tensor,  # [kv_heads, num_slots, head_dim]
    values: torch.Tensor,
    lengths: torch.Tensor,  # [n] int64
    table: torch.Tensor,  # [table rows, width] int64 slot ids
    table_rows: torch.Tensor,  # [n] int64
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """What the Triton kernel computes, in torch ops (it gathers the keys: a test reference, not a fast
    path). Scores, softmax and the weighted sum in fp32; the result in q's dtype, [heads, n, head_dim].
    With `window`, row i reads only the last `window` of its lengths[i] keys."""
    heads, n, head_dim = q.shape
    kv = keys.shape[0]
    slots = table[table_rows]  # [n, width]
    k = keys[:, slots].float()  # [kv, n, width, head_dim]
    v = values[:, slots].float()
    grouped = q.float().view(kv, heads // kv, n, head_dim)
    scores = torch.einsum("kgnd,knwd->kgnw", grouped, k) * scale
    columns = torch.arange(slots.shape[1], device=q.device)[None, :]
    past = columns >= lengths[:, None]  # [n, width]
    if window is not None:
        past |= columns < lengths[:, None] - window
    weights = torch.softmax(scores.masked_fill(past, float("-inf")), dim=-1)
    return torch.einsum("kgnw,knwd->kgnd", weights, v).reshape(heads, n, head_dim).to(q.dtype)


def triton_available() -> bool:
    """Triton imports here (it is only ever imported for CUDA tensors, or by tests in interpreter mode)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def attend_rows(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    table: torch.Tensor,
    table_rows: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """attend_rows_reference's result, computed by the Triton paged-attention kernels without gathering
    (speclm/kernels/triton_attention.py)."""
    from speclm.kernels.triton_attention import paged_attention

    return paged_attention(q, keys, values, lengths, table, table_rows, scale, window)


def attend_decode_rows(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor | None,
    slot_rows: torch.Tensor | None,
    window: int | None = None,
) -> torch.Tensor:
    """attend_like_decoding for GPU tensors, from a DecodeRows' fields (with `window`: each row over its
    last `window` keys). Without a slot table the rows read the first lengths[i] slots of a contiguous
    cache: the table is then one row 0..num_slots-1 (no host sync to learn the longest row; the kernel
    reads only up to each row's length)."""
    if slots is None:
        table = torch.arange(keys.shape[1], device=q.device)[None]
        table_rows = torch.zeros_like(lengths)
    else:
        table = slots
        table_rows = torch.arange(len(lengths), device=q.device) if slot_rows is None else slot_rows
    return attend_rows(q, keys, values, lengths, table, table_rows, q.shape[-1] ** -0.5, window)


class GpuBatchPlan:
    """How a paged step's rows are attended on a GPU, decided once per step from host-side sizes (no sync):
    a sequence whose new rows are its whole causal prompt runs one SDPA call (is_causal) over its freshly
    written slots, but for the row that completes the prompt (`completes[i]`: the chunk has logits); all
    other rows (decode, verification, token trees, later prompt chunks, that last prompt row) run through
    the paged kernel over the step's pooled DecodeRows. Without `prompt_sdpa` every row runs through the
    kernel (batch-invariant: PagedAttentionMetadata). `sequences` is PagedAttentionMetadata.sequences."""

    def __init__(
        self, sequences, device: torch.device, completes: list[bool] | None = None, prompt_sdpa: bool = True
    ) -> None:
        self.prefill: list[tuple[int, int, torch.Tensor]] = []  # (first row, rows, slots [rows])
        other: list[range] = []
        row = 0
        for i, (slots, local) in enumerate(sequences):
            n = len(local.lengths)
            # The row that completes a prompt (it has logits) runs through the kernel, as a decoding row
            # would: the first token's logits come from the arithmetic of every later token's.
            by_sdpa = n - 1 if completes is not None and completes[i] else n
            if prompt_sdpa and local.slots is None and by_sdpa >= PREFILL_SDPA_MIN_ROWS and n == slots.shape[0]:
                self.prefill.append((row, by_sdpa, slots[:by_sdpa]))
                other.append(range(row + by_sdpa, row + n))
            else:
                other.append(range(row, row + n))
            row += n
        other = [rs for rs in other if len(rs)]
        self.num_rows = row
        self.other_rows = (
            torch.tensor([r for rs in other for r in rs], dtype=torch.long, device=device)
            if other and self.prefill
            else None
        )  # [rows through the kernel] when the step mixes both kinds
        self.kernel_only = not self.prefill
        self.sdpa_only = not other

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pooled, window: int | None = None
    ) -> torch.Tensor:
        """All rows q [heads, num_tokens, head_dim] once their keys are in the pool; `pooled()` returns the
        step's pooled DecodeRows (built once per step, only when some rows need the kernel). With `window`,
        each row over its last `window` keys (a prompt's SDPA call then takes a banded causal mask)."""
        if self.kernel_only:
            rows = pooled()
            return attend_decode_rows(q, k_cache, v_cache, rows.lengths, rows.slots, rows.slot_rows, window)
        out = torch.empty_like(q)
        gqa = q.shape[0] != k_cache.shape[0]
        for first, n, slots in self.prefill:
            mask = None if window is None or window >= n else self._band(n, window, q.device)
            out[:, first : first + n] = F.scaled_dot_product_attention(
                q[None, :, first : first + n],
                k_cache[None, :, slots],
                v_cache[None, :, slots],
                attn_mask=mask,
                is_causal=mask is None,
                enable_gqa=gqa,
            )[0]
        if not self.sdpa_only:
            rows, sel = pooled(), self.other_rows
            table_rows = torch.arange(self.num_rows, device=q.device) if rows.slot_rows is None else rows.slot_rows
            out[:, sel] = attend_decode_rows(
                q[:, sel], k_cache, v_cache, rows.lengths[sel], rows.slots, table_rows[sel], window
            )
        return out

    @staticmethod
    def _band(n: int, window: int, device: torch.device) -> torch.Tensor:
        """[n, n] True where row i may attend key j: causal, and at most `window` keys back (itself included)."""
        i = torch.arange(n, device=device)[:, None]
        j = torch.arange(n, device=device)[None, :]
        return (j <= i) & (j > i - window)
