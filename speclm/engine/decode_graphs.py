"""Decode and verification steps from fixed buffers, replayed as CUDA graphs.

A step whose rows all attend like decoding and all need logits (plain decoding, verification chains, small
token trees: no prompt chunk) is laid out on the host as rows (token, position, write slot, length, table
row) plus a slot table, padded to a bucket of BUCKETS rows, and copied into fixed device buffers in one
transfer. A bucket's pass (layers, head) is captured in a CUDA graph on its first use, after
one warm-up pass, and replayed after that: one launch instead of a few hundred, and no host
synchronisation until each row's argmax is read (the pass ends with it: a greedy step copies no logits).
Padded rows write their keys to a scratch slot (a block the block manager never hands out) and read one
key, so they never change a real row. A step whose rows are all at most SHORT_TABLE keys long replays a
graph over that much of the slot table (the attention kernel then takes its single pass, not split-K's
two launches); a row's bits are the same either way.

Greedy plain decoding runs a step ahead: when the caller says every row will take its argmax and run again
(ModelRunner.forward's `ahead`), the next step is queued right behind this one, its tokens copied from this
pass's argmax on the device, so the GPU need not wait for the host to read a token, pick the next and lay out
its rows. The next call is served from it when its rows are the ones predicted (Ahead.predicts), else the
pass started ahead is dropped.

The same layout runs without capture on any device (mode "eager"): the CPU tests check it against the
eager path, so on a GPU only the capture and the replay are new. Other steps (prompts, mixed steps, rows
past MAX_ROWS, eviction's queries) take the eager path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from speclm.models.attention import BatchEntry
from speclm.models.linear import BATCH_INVARIANT_ROWS
from speclm.models.llama import LlamaModel
from speclm.models.static_rows import StaticRowsMetadata

log = logging.getLogger(__name__)

# Rows per captured pass: whole GEMM chunks (row_chunked pads every projection to them anyway, so a smaller
# pass would only add a padding copy per projection); the second bucket takes 8 chains of K + 1 = 5 rows.
BUCKETS = (BATCH_INVARIANT_ROWS, 2 * BATCH_INVARIANT_ROWS)
MAX_ROWS = BUCKETS[-1]
FIELDS = 5  # tokens, positions, write slots, lengths, table rows
# The table columns of a short step's graph: one split-K partition of the GPU attention kernel
# (triton_attention.PARTITION_KEYS), within which its single pass and split-K compute the same bits.
SHORT_TABLE = 256


@dataclass
class StepRows:
    """One step's rows on the host, padded to `bucket` rows: FIELDS vectors, then the slot table's real
    rows (`table_count` of them, each padded to `padded` entries), flat."""

    num_rows: int
    bucket: int
    table_count: int
    width: int  # the step's longest table row
    columns: int  # the table columns its pass reads: SHORT_TABLE when its rows fit, else the whole table's
    max_position: int
    flat: list[int]  # FIELDS * bucket vector values, then table_count * padded table entries

    @property
    def short(self) -> bool:
        """Whether the pass reads the short table: then `flat` is its inputs' layout (rows padded to columns)."""
        return self.columns == SHORT_TABLE

    @property
    def padded(self) -> int:
        return self.columns if self.short else self.width


def step_rows(entries: list[BatchEntry], scratch: int, max_width: int, max_positions: int) -> StepRows | None:
    """The rows of a step that a static pass can run, or None (a prompt chunk, rows without logits, too many
    rows, a row longer than the table, a position past the model's). A chain's rows share its sequence's
    table row; a tree row has its own (the prefix, then its path), as PagedAttentionMetadata.pooled has them."""
    tokens, positions, writes, lengths, table_rows, table = [], [], [], [], [], []
    for e in entries:
        n, total = len(e.tokens), len(e.slots)
        if e.num_logits != n or (e.row_paths is None and n > 1 and n == total):  # (a whole prompt: SDPA's)
            return None
        first = total - n
        tokens += e.tokens
        positions += e.positions()
        writes += e.slots[first:]
        if e.row_paths is None:
            lengths += range(first + 1, total + 1)
            table_rows += [len(table)] * n
            table.append(e.slots)
        else:
            for path in e.row_paths:
                lengths.append(first + len(path))
                table_rows.append(len(table))
                table.append(e.slots[:first] + [e.slots[first + r] for r in path])
    n = len(tokens)
    bucket = next((b for b in BUCKETS if b >= n), None)
    width = max((len(t) for t in table), default=1)
    if n == 0 or bucket is None or width > max_width or max(positions) >= max_positions:
        return None
    pad = bucket - n
    vectors = [tokens, positions, writes, lengths, table_rows]
    # A padded row writes the scratch slot and reads one key: the first slot of table row 0 (any valid
    # slot would do, its result is dropped), so table rows past the real ones are never read.
    padding = [[0] * pad, [0] * pad, [scratch] * pad, [1] * pad, [0] * pad]
    flat = [x for v, p in zip(vectors, padding) for x in v + p]
    columns = SHORT_TABLE if width <= SHORT_TABLE < max_width else max_width
    rows = StepRows(n, bucket, len(table), width, columns, max(positions), flat)
    for t in table:
        flat += t + [scratch] * (rows.padded - len(t))
    return rows


@dataclass
class Captured:
    graph: object  # torch.cuda.CUDAGraph
    hidden: torch.Tensor  # [bucket, hidden]: the graph's outputs, rewritten by every replay
    logits: torch.Tensor  # [bucket, vocab]: the head's output (the model's dtype)
    argmax: torch.Tensor  # [bucket] int64: each row's greedy choice
    rotary: int  # the rotary table's address at capture (a grown table moves: the graph is then stale)


@dataclass
class Launched:
    """A step whose pass is queued: its rows, its outputs (copies out of the fixed buffers, so the next pass may
    rewrite those), and the event after its argmax's copy to the host."""

    rows: StepRows
    logits: torch.Tensor
    hidden: torch.Tensor
    device_argmax: torch.Tensor  # [rows]: the fixed buffer (valid until the next pass)
    argmax: torch.Tensor  # [rows] on the host, once `done`
    done: object | None  # torch.cuda.Event (None on the CPU: done)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.done is not None:
            self.done.synchronize()
        return self.logits, self.hidden, self.argmax.clone()  # (the host buffer is reused two steps on)


@dataclass
class Ahead:
    """A step started before its call: `launched`, predicted from `after` (each row's argmax as its token)."""

    after: Launched
    launched: Launched

    def predicts(self, rows: StepRows) -> bool:
        """Whether the step that came is the one started: the same layout with the tokens `after` chose."""
        predicted = self.launched.rows
        if (rows.bucket, rows.columns, rows.num_rows) != (predicted.bucket, predicted.columns, predicted.num_rows):
            return False
        n = rows.num_rows
        return rows.flat[:n] == self.after.argmax.tolist() and rows.flat[n:] == predicted.flat[n:]


class DecodeGraphs:
    """The static buffers of one KV pool and the graphs captured over them (one per bucket). mode "graph"
    captures and replays (CUDA), "eager" runs the same buffers without capture (any device)."""

    def __init__(self, model: LlamaModel, pool_slots: int, scratch: int, mode: str) -> None:
        assert mode in ("graph", "eager"), mode
        self.model, self.scratch, self.mode = model, scratch, mode
        device = model.device
        self.positions = model.config.max_position_embeddings  # positions a pass may hold
        self.width = min(pool_slots, self.positions)  # a sequence's slots at most
        # A short step's inputs: its vectors [FIELDS, bucket] then its table [bucket, SHORT_TABLE], both
        # contiguous, so one copy from the host fills them. A long step's: the whole table's buffers below,
        # filled from a device copy of its rows (the table is too wide to copy whole).
        self.short = torch.full((FIELDS * MAX_ROWS + MAX_ROWS * SHORT_TABLE,), scratch, dtype=torch.long, device=device)
        self.vectors = torch.zeros(FIELDS, MAX_ROWS, dtype=torch.long, device=device)
        self.table = torch.full((MAX_ROWS, self.width), scratch, dtype=torch.long, device=device)
        size = FIELDS * MAX_ROWS + MAX_ROWS * self.width
        self.staging = torch.empty(size, dtype=torch.long, device=device) if device.type == "cuda" else None
        pinned = device.type == "cuda"
        self.host = [torch.empty(size, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.host_values = [h.numpy() for h in self.host]  # (filled from a list without a tensor in between)
        self.argmax_host = [torch.empty(MAX_ROWS, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self.loaded: list = [None, None]  # per host buffer, the event after its last copy to the device
        self.turn = 0
        self.pending: Ahead | None = None  # a step started ahead of its call (_run_ahead)
        self.ahead_hits = 0  # steps whose pass was started ahead and used
        self.graphs: dict[tuple[int, int], Captured] = {}  # by (bucket, table columns)
        self.steps = 0  # steps run from the static buffers (the tests and the benchmark read these)
        self.captures = 0
        self.failed: str | None = None  # why capturing failed once (the runner then stays eager)

    @torch.inference_mode()
    def run(
        self, cache, entries: list[BatchEntry], ahead: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(logits [rows, vocab] where the model lies, hidden [rows, hidden], each row's argmax [rows] on the
        host) of the step, or None when the static pass does not cover it (the caller runs the eager path).
        `ahead`: the caller's word that every row will take its argmax and run again with one token (greedy
        plain decoding); the next step is then started before this one's argmax is read (_run_ahead)."""
        pending, self.pending = self.pending, None
        if self.failed is not None:
            return None
        rows = step_rows(entries, self.scratch, self.width, self.positions)
        if rows is None:
            return None
        if pending is not None and pending.predicts(rows):
            launched = pending.launched
            self.ahead_hits += 1
        else:
            launched = self._launch(cache, rows)
            if launched is None:
                return None
        self.steps += 1
        if ahead:
            self.pending = self._run_ahead(cache, entries, launched)
        return launched.outputs()

    def drop_ahead(self) -> None:
        """Forget a step started ahead (the caller runs another step eagerly): it is never matched later."""
        self.pending = None

    def _launch(self, cache, rows: StepRows, tokens: torch.Tensor | None = None) -> Launched | None:
        """Load the rows (with `tokens`, their tokens from a device tensor instead), start their pass and copy
        its outputs out of the fixed buffers; nothing waits for the GPU here."""
        self.model.reserve_positions(rows.max_position + 1)  # (a grown table moves: its graphs are captured again)
        self._load(rows)
        if tokens is not None:
            self._inputs(rows.bucket, rows.columns)[0][0, : rows.num_rows].copy_(tokens)
        if self.mode == "eager":
            hidden, logits, argmax = self._pass(cache, rows.bucket, rows.columns, rows.max_position)
        else:
            captured = self._graph(cache, rows.bucket, rows.columns, rows.max_position)
            if captured is None:
                return None
            captured.graph.replay()
            hidden, logits, argmax = captured.hidden, captured.logits, captured.argmax
        n = rows.num_rows
        # The argmax's copy to the host is the step's one synchronisation; the logits stay where they are
        # (copied out of the graph's buffers, which the next replay rewrites) until a read needs them.
        host = self.argmax_host[self.turn][:n]
        host.copy_(argmax[:n], non_blocking=True)
        done = self._event()
        logits = self.model.finish_logits(logits[:n].to(torch.float32, copy=True))  # (a copy: the buffer is reused)
        return Launched(rows, logits, hidden[:n].clone(), argmax[:n], host, done)

    def _run_ahead(self, cache, entries: list[BatchEntry], launched: Launched) -> Ahead | None:
        """Start the step that follows `launched` if every row takes its argmax: each row's next token (the
        argmax, copied on the device) at the next position, written at the next slot of its block. Only
        within a block: that slot is the sequence's own and not yet written (a block's first slot may be a
        new or a shared block's, which only the scheduler knows). Whether the prediction held is checked
        when the next step comes (Ahead.predicts); if not, its pass is dropped: the one slot it wrote per
        row holds the keys of the row's next token at its next position, which a step that reads that slot
        writes first (in stream order, after the dropped pass)."""
        block = cache.block_size
        following = []
        for e in entries:
            if len(e.tokens) != 1 or e.row_paths is not None or e.local_slots is not None:
                return None
            slot = e.slots[-1] + 1
            if slot % block == 0:
                return None
            following.append(BatchEntry([0], e.start + 1, e.slots + [slot], 1))
        rows = step_rows(following, self.scratch, self.width, self.positions)
        if rows is None:
            return None
        ahead = self._launch(cache, rows, launched.device_argmax)
        return None if ahead is None else Ahead(launched, ahead)

    def _event(self):
        """An event after the work queued so far (None on the CPU, whose copies are done when they return)."""
        if self.model.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def _load(self, rows: StepRows) -> None:
        """The step's rows into the fixed buffers: a short step's in one host-to-device copy, a long step's in
        one, then two on the device. The host buffers take turns: a step started ahead loads while the
        previous step's copy may still be queued."""
        self.turn ^= 1
        if self.loaded[self.turn] is not None:
            self.loaded[self.turn].synchronize()  # (the copy from this buffer two loads ago: long done)
        b, t, w, size = rows.bucket, rows.table_count, rows.width, len(rows.flat)
        self.host_values[self.turn][:size] = rows.flat
        host = self.host[self.turn][:size]
        if rows.short:
            self.short[:size].copy_(host, non_blocking=True)
        else:
            source = host if self.staging is None else self.staging[:size].copy_(host, non_blocking=True)
            self.vectors[:, :b].copy_(source[: FIELDS * b].view(FIELDS, b))
            self.table[:t, :w].copy_(source[FIELDS * b :].view(t, w))
        self.loaded[self.turn] = self._event()

    def _inputs(self, bucket: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The vectors [FIELDS, bucket] and slot table [bucket, columns] a pass reads."""
        if columns == SHORT_TABLE:
            head = FIELDS * bucket
            vectors = self.short[:head].view(FIELDS, bucket)
            return vectors, self.short[head : head + bucket * SHORT_TABLE].view(bucket, SHORT_TABLE)
        return self.vectors[:, :bucket], self.table[:bucket, :columns]

    def _pass(
        self, cache, bucket: int, columns: int, max_position: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The forward, the head and each row's argmax (greedy choice) over the first `bucket` rows, their
        keys in the table's first `columns` columns."""
        v, table = self._inputs(bucket, columns)
        meta = StaticRowsMetadata(v[2], v[3], table, v[4], max_position)
        hidden = self.model(v[0], v[1], cache, meta)
        # The head's output as it comes (the model's dtype): made fp32 outside the pass for the real rows only
        # (Launched); the argmax of an uncapped head's output is the fp32 logits' (the cast keeps the order).
        logits = self.model.head_logits(hidden)
        if self.model.config.final_logit_softcapping:
            return hidden, logits, self.model.finish_logits(logits).argmax(-1)
        if logits.device.type == "cuda":
            from speclm.kernels.triton_ops import argmax_rows

            return hidden, logits, argmax_rows(logits)
        return hidden, logits, logits.argmax(-1)

    def _graph(self, cache, bucket: int, columns: int, max_position: int) -> Captured | None:
        """The graph of the bucket and table columns, captured now if it is new (or its rotary table moved)."""
        captured = self.graphs.get((bucket, columns))
        if captured is not None and captured.rotary == self.model.rotary.cos_table.data_ptr():
            return captured
        try:
            captured = self._capture(cache, bucket, columns, max_position)
        except Exception as e:  # (the eager path computes the same rows; say so once and stay there)
            self.failed = f"{type(e).__name__}: {e}"
            log.warning("speclm: capturing a CUDA graph failed; decoding stays eager: %s", self.failed)
            return None
        self.graphs[bucket, columns] = captured
        self.captures += 1
        return captured

    def _capture(self, cache, bucket: int, columns: int, max_position: int) -> Captured:
        """Warm up on a side stream (Triton compiles, cuBLAS picks and allocates outside the capture), then
        capture the pass. Its inputs are the step's own rows: the warm-up writes the same keys the replay does.
        (max_position only lets the rotary lookup skip its read-back; the tables already cover it.)"""
        device = self.model.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._pass(cache, bucket, columns, max_position)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (a server's) neither break this capture nor get captured
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            hidden, logits, argmax = self._pass(cache, bucket, columns, max_position)
        return Captured(graph, hidden, logits, argmax, self.model.rotary.cos_table.data_ptr())
