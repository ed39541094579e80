"""ModelRunner: the only engine component that touches model tensors."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass

import torch

from speclm.engine.decode_graphs import DecodeGraphs
from speclm.kv.hybrid import HybridKVCache
from speclm.kv.paged_cache import PagedKVCache
from speclm.kv.quantized import int8_bytes_per_token
from speclm.models.attention import BatchEntry, PagedAttentionMetadata
from speclm.models.linear import BATCH_INVARIANT_ROWS
from speclm.models.llama import LlamaModel
from speclm.sample.row_logits import RowLogits

log = logging.getLogger(__name__)


class ModelRunner:
    """Runs the target model over the new tokens of a batch of sequences through a paged cache and
    returns their logits and features.

    decode_graphs: "auto" replays decode and verification steps as CUDA graphs on a GPU (none on the
    CPU), "off" never, "eager" runs those steps from the same fixed buffers without capture on any
    device (the CPU tests of that path; engine/decode_graphs.py). batch_invariant: on a GPU, every
    projection and the head run over fixed chunks of BATCH_INVARIANT_ROWS rows, so a row's logits do not
    depend on the rows beside it (exact speculative greedy in bf16; models/linear.py row_chunked), and
    prompt rows attend through the paged kernel like every other row, not through one fused SDPA call
    (PagedAttentionMetadata.prompt_sdpa: a prefix-cache hit then leaves the output unchanged)."""

    def __init__(self, model: LlamaModel, decode_graphs: str = "auto", batch_invariant: bool = True) -> None:
        if decode_graphs not in ("auto", "off", "eager"):
            raise ValueError(f"decode_graphs must be auto, off or eager, got {decode_graphs!r}")
        self.model = model
        on_gpu = model.device.type == "cuda"
        model.use_lean_ops(gemm_rows=BATCH_INVARIANT_ROWS if batch_invariant and on_gpu else None)
        self.batch_invariant = batch_invariant and on_gpu
        self.graph_mode = {"auto": "graph" if on_gpu else None, "off": None, "eager": "eager"}[decode_graphs]
        self._graphs: weakref.WeakKeyDictionary[PagedKVCache, DecodeGraphs] = weakref.WeakKeyDictionary()
        self.config = model.config
        self.slow_steps = SlowStepWatch()
        self.thread_watch = ThreadWatch()  # built where the model was loaded (LLM): that thread should run it

    @property
    def context_length(self) -> int:
        return self.config.max_position_embeddings

    @property
    def local_layers(self) -> list[bool]:
        """Per layer: whether it attends over a sliding window."""
        return [self.config.is_local(i) for i in range(self.config.num_layers)]

    def new_paged_cache(
        self, num_blocks: int, block_size: int, quantize: bool = False, num_layers: int | None = None
    ) -> PagedKVCache:
        """A pool of num_blocks blocks for every layer (or for num_layers of them: one kind's pool). A whole
        model's pool with decode graphs has one block more, never handed out: padded rows of a static step
        write their keys there (a model with a pool per layer kind runs its steps eagerly)."""
        c, device = self.config, self.model.device
        layers = c.num_layers if num_layers is None else num_layers
        spare = 1 if self.graph_mode and not quantize and num_layers is None else 0
        cache = PagedKVCache(
            layers, c.num_kv_heads, c.head_dim, num_blocks + spare, block_size, self.model.attn_dtype, device, quantize
        )
        if spare:
            pool = num_blocks * block_size
            self._graphs[cache] = DecodeGraphs(self.model, pool, pool, self.graph_mode)
        return cache

    def decode_graphs(self, cache: PagedKVCache) -> DecodeGraphs | None:
        """The static buffers and graphs of `cache` (None without decode graphs)."""
        return self._graphs.get(cache)

    def new_hybrid_cache(self, full_blocks: int, local_blocks: int, block_size: int, quantize: bool) -> HybridKVCache:
        """The two pools of a model with sliding-window layers (speclm/kv/hybrid.py)."""
        local, num_local = self.local_layers, sum(self.local_layers)
        full = self.new_paged_cache(full_blocks, block_size, quantize, len(local) - num_local)
        return HybridKVCache(full, self.new_paged_cache(local_blocks, block_size, quantize, num_local), local)

    def kv_bytes_per_token(self, quantize: bool = False, num_layers: int | None = None) -> int:
        """Bytes of keys and values per token in every layer (or in num_layers of them)."""
        c = self.config
        layers = c.num_layers if num_layers is None else num_layers
        if quantize:
            return int8_bytes_per_token(layers, c.num_kv_heads, c.head_dim)
        return 2 * layers * c.num_kv_heads * c.head_dim * self.model.attn_dtype.itemsize

    def forward_batch(
        self, cache: PagedKVCache, entries: list[BatchEntry], queries: list[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One step over the new tokens of several sequences, flattened through the layers together.
        With `queries` (a list), each layer appends its rotated queries [heads, num_tokens, head_dim].

        Returns (logits [sum of num_logits, vocab] in entry order, on the host, features [num_tokens, hidden]
        (hidden states after the final norm, for proposers that draft from them), seconds).
        """
        out = self.forward(cache, entries, queries)
        return out.host_logits(), out.hidden, out.seconds

    def forward(
        self,
        cache: PagedKVCache,
        entries: list[BatchEntry],
        queries: list[torch.Tensor] | None = None,
        ahead: bool = False,
    ) -> ModelOutput:
        """forward_batch's step as a ModelOutput: a static step (decode_graphs) leaves its logits where the
        model lies and brings only each row's argmax to the host (ModelOutput.argmax). `ahead`: every row
        will take its argmax and run again (greedy plain decoding), so the static step may start the next
        step before this one's tokens are read (DecodeGraphs.run)."""
        self.thread_watch.observe()
        t0 = time.perf_counter()
        graphs, static = self._graphs.get(cache), None
        if graphs is not None and queries is None:
            static = graphs.run(cache, entries, ahead)
        elif graphs is not None:  # (an eager step between: a step run ahead is never matched after it)
            graphs.drop_ahead()
        if static is not None:  # a decode or verification step from the fixed buffers (a CUDA graph's replay)
            logits, hidden, argmax = static
            seconds = time.perf_counter() - t0
            self.slow_steps.observe(len(hidden), seconds)
            return ModelOutput(logits, hidden, seconds, queries, argmax)
        device = self.model.device
        tokens = torch.tensor([t for e in entries for t in e.tokens], dtype=torch.long, device=device)
        positions = torch.tensor([p for e in entries for p in e.positions()], device=device)
        rows, offset = [], 0
        for e in entries:
            offset += len(e.tokens)
            rows.extend(range(offset - e.num_logits, offset))
        hidden = self.model(
            tokens,
            positions,
            cache,
            PagedAttentionMetadata(entries, device, queries, prompt_sdpa=not self.batch_invariant),
        )
        logits = self.model.compute_logits(hidden, rows) if rows else torch.zeros(0, self.config.vocab_size)
        seconds = time.perf_counter() - t0
        self.slow_steps.observe(len(tokens), seconds)
        return ModelOutput(logits, hidden, seconds, queries)

    def execute(
        self,
        cache: PagedKVCache,
        copies: list[tuple[int, int]],
        entries: list[BatchEntry],
        want_queries: bool,
        ahead: bool = False,
    ) -> ModelOutput:
        """A scheduled step: the block copies (copy-on-write) it needs, then one forward over its entries
        (with each layer's queries when `want_queries`: token eviction scores committed rows with them;
        `ahead`: see forward)."""
        cache.copy_blocks(copies)
        return self.forward(cache, entries, [] if want_queries else None, ahead)

    def row_logits(self, hidden: torch.Tensor) -> RowLogits:
        """Logits of single rows of `hidden` [rows, hidden] on demand, each computed once with the
        one-row call plain decoding makes (a tree walk needs only its path's rows)."""
        return RowLogits.on_demand(lambda row: self.model.compute_logits(hidden, [row])[0])


@dataclass
class ModelOutput:
    """What one forward produced: logits [sum of num_logits, vocab] in entry order (on the host, or on the
    GPU after a static step), features [num_tokens, hidden] (hidden states after the final norm), its
    seconds, per layer the rotated queries [heads, num_tokens, head_dim] when they were asked for, and
    each logits row's argmax [rows] on the host when the GPU took it (None: read it from the logits)."""

    logits: torch.Tensor
    hidden: torch.Tensor
    seconds: float
    queries: list[torch.Tensor] | None
    argmax: torch.Tensor | None = None

    def host_logits(self) -> torch.Tensor:
        """The logits on the host: a GPU's are copied once, for every chunk of the step that needs them."""
        if self.logits.device.type != "cpu":
            self.logits = self.logits.cpu()
        return self.logits


class SlowStepWatch:
    """Warns once when a small step (a few rows: decoding) takes far longer than the fastest one so far,
    which on a CPU almost always means other processes hold the cores."""

    def __init__(self, max_rows: int = 8, factor: float = 20.0, min_seconds: float = 0.5) -> None:
        self.max_rows, self.factor, self.min_seconds = max_rows, factor, min_seconds
        self.fastest = float("inf")
        self.warned = False

    def observe(self, rows: int, seconds: float) -> None:
        if rows > self.max_rows:
            return
        if not self.warned and seconds > self.min_seconds and seconds > self.factor * self.fastest:
            self.warned = True
            log.warning(
                "speclm: a decoding step took %.2f s, %.0fx the fastest so far: other processes may be using the "
                "CPU cores (try --threads 1, or fewer threads than free cores)",
                seconds,
                seconds / self.fastest,
            )
        self.fastest = min(self.fastest, seconds)


class ThreadWatch:
    """Warns once when the model runs on a thread other than the one that loaded it: torch's intra-op
    pool is an OpenMP team per calling thread, and a second team makes both spin less and sleep more
    (the same engine measured 0.6-0.7x as fast from a worker thread; docs/runtime.md#threads)."""

    def __init__(self) -> None:
        self.home = threading.get_ident()  # the loading thread
        self.warned = False

    def observe(self) -> None:
        if not self.warned and threading.get_ident() != self.home:
            self.warned = True
            log.warning(
                "speclm: the model runs on thread %r but was loaded on another: torch's CPU thread pool then "
                "keeps two OpenMP teams, which can slow every step ~1.5x; load and run it on one thread "
                "(speclm serve runs its engine on the loading thread)",
                threading.current_thread().name,
            )
