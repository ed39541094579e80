"""Draft-model proposers: a separate small model (draft:PATH) or the target's first N layers (layerskip:N)."""

from __future__ import annotations

import copy
import json
import os
import time

import torch

from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.sample.masked import mask_logits
from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams
from speclm.speculative.draft_head import DraftHead
from speclm.speculative.proposer import Proposal, Proposer

TOKEN_MAP_FILE = "speclm_token_map.json"  # beside a draft's weights; not *.safetensors, which loaders read as weights
PROMPT_MEMO_BYTES = 64 << 20  # the most cache the prompt memo keeps (a 0.5B draft: ~2,600 tokens)


class PromptMemo:
    """A draft model's cache rows for the latest prompt it started on, shared by all its sequences.

    A request whose prompt starts with the same tokens (the chat template's system prompt, the
    earlier turns of a conversation) copies those rows instead of computing them again: the draft's
    prefill is a fixed cost per request that short answers cannot pay back (the target's prefix
    cache does the same for the target). The rows are the ones a fresh prefill would compute, since
    every row of a pass is computed as decoding computes it.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.keys: torch.Tensor | None = None  # [layers, kv_heads, len(ids), head_dim]
        self.values: torch.Tensor | None = None

    def restore(self, prompt_ids: list, cache) -> int:
        """Copy the rows of the longest common prefix (the prompt's last token excluded, whose logits
        the first proposal needs) into a fresh `cache`; returns how many. The entries compared are
        whatever identifies a row: token ids, or (token, position) pairs for a windowed draft."""
        n, limit = 0, min(len(self.ids), len(prompt_ids) - 1)
        while n < limit and self.ids[n] == prompt_ids[n]:
            n += 1
        if n:
            cache.keys[:, :, :n] = self.keys[:, :, :n]
            cache.values[:, :, :n] = self.values[:, :, :n]
            cache.truncate(n)
        return n

    def remember(self, prompt_ids: list, cache) -> None:
        """Keep the rows of `prompt_ids` (already in `cache`'s first slots), as many as the budget allows."""
        per_token = 2 * cache.keys[:, :, :1].nbytes
        n = min(len(prompt_ids), PROMPT_MEMO_BYTES // per_token)
        self.ids = list(prompt_ids[:n])
        self.keys = cache.keys[:, :, :n].clone()
        self.values = cache.values[:, :, :n].clone()


def load_token_map(model_dir: str, vocab_size: int) -> torch.Tensor | None:
    """A draft directory's frequent-token subset ([V'] token ids, written by `speclm distill`), or None."""
    path = os.path.join(model_dir, TOKEN_MAP_FILE)
    if not os.path.isdir(model_dir) or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            ids = torch.tensor(json.load(f), dtype=torch.long)
    except (json.JSONDecodeError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: not a list of token ids ({e})") from e
    if ids.ndim != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{path}: token ids must be a non-empty list in [0, {vocab_size})")
    return ids


class CatchUpRate:
    """What a draft model's catch-ups cost per token (a pass over a prompt it has not read), measured on
    those of MIN_TOKENS tokens or more (fewer are a step's new tokens, paid like drafting) and decayed."""

    MIN_TOKENS = 64
    SMOOTHING = 0.3

    def __init__(self) -> None:
        self.seconds_per_token: float | None = None

    def record(self, tokens: int, seconds: float) -> None:
        if tokens < self.MIN_TOKENS:
            return
        rate, s = seconds / tokens, self.SMOOTHING
        self.seconds_per_token = rate if self.seconds_per_token is None else (1 - s) * self.seconds_per_token + s * rate

    def seconds(self, tokens: int) -> float:
        """Expected seconds of a catch-up over `tokens` (0.0 before any was measured)."""
        return 0.0 if self.seconds_per_token is None else tokens * self.seconds_per_token


class DraftModelProposer(Proposer):
    """Runs a cheaper model autoregressively for k steps with its own KV cache.

    The cache stays in sync by construction: before each proposal the proposer keeps the longest
    prefix of what it has cached that still agrees with the committed context, and feeds the rest.
    So rejected drafts are rolled back without the engine telling it which ones.

    With a `token_map` ([V'] token ids) the draft's head scores only that subset, plus the tokens of
    this sequence's context outside it (speclm/speculative/draft_head.py): its distribution q is zero
    elsewhere, which the verifier handles like any other q (output stays exact), and the head's matmul
    shrinks by about vocab / V'.

    With a `window` the draft reads only part of a long prompt: its first `sinks` tokens (attention
    sinks) and its last `window` tokens, then everything generated. The draft's cache holds this
    *view* of the context; the dropped middle keeps its place in the positions (the kept tokens have
    their real positions, a gap where the middle was); renumbering them (`renumber=True`) made no
    consistent difference (benchmarks/draft_window/draft_window.md). The target verifies every draft,
    so what the draft reads never changes the output, only how often it is right.

    With a `stop` P > 0 a chain ends before its K drafts once the product of the draft's top probabilities
    along it (its own estimate that every draft so far will be accepted) falls below P: the last draft is
    still proposed (its logits are paid for; a verification row costs little), but no further draft pass
    is run. The length depends on the draft's distributions only, so the output stays exact.
    """

    samples_under_grammar = True

    def __init__(
        self,
        model: LlamaModel,
        num_layers: int | None = None,
        name: str = "draft",
        token_map: torch.Tensor | None = None,
        window: int = 0,
        sinks: int = 0,
        renumber: bool = False,
        stop: float = 0.0,
    ) -> None:
        if window < 0 or sinks < 0:
            raise ValueError(f"a draft's prompt window and sinks must be >= 0, got window={window}, sinks={sinks}")
        if not 0.0 <= stop < 1.0:
            raise ValueError(f"a draft's stop must be in [0, 1), got {stop}")
        self.stop = stop
        self.model = model
        if model.lean_ops is None:  # a draft model of its own (layerskip shares the runner's target)
            model.use_lean_ops()
        self.num_layers = num_layers
        self.name = name
        self.head = DraftHead(model.lm_head, token_map, model.config.vocab_size)
        self.window, self.sinks, self.renumber = window, sinks, renumber  # window 0: the whole prompt
        self.dropped = 0  # prompt tokens after the sinks that this sequence's draft does not read
        self.cache = None
        self.cached_ids: list[int] = []  # the view's tokens in the cache (see view())
        self.prompt_memo = PromptMemo()  # shared with every fresh() copy
        self.catch_up_rate = CatchUpRate()  # shared with every copy: the same model on the same machine
        self.unremembered: list[int] | None = None  # this sequence's prompt (its view) until the memo holds it

    def calibrate(self) -> None:
        """Seed the catch-up rate with a timed read of CatchUpRate.MIN_TOKENS tokens (the second of two: the
        first pays one-time costs). Unseeded, a draft's first long read would be made unpriced: on the real
        pair, ~2.5 s over the context of the last sequence of a batch, for one drafted token. CPU only (a
        GPU's passes are not timed by the clock alone); the rate decays toward the measured catch-ups."""
        if self.model.device.type != "cpu":
            return
        n = CatchUpRate.MIN_TOKENS
        tokens, positions = torch.zeros(n, dtype=torch.long), torch.arange(n)
        for _ in range(2):
            cache = self.model.new_cache(n, self.num_layers)
            t0 = time.perf_counter()
            with torch.no_grad():
                self.model(tokens, positions, cache, AttentionMetadata(0, n), num_layers=self.num_layers)
            seconds = time.perf_counter() - t0
        self.catch_up_rate.record(n, seconds)

    def fresh(self) -> DraftModelProposer:
        """Another sequence's proposer on the same draft model and output head, with its own cache."""
        other = copy.copy(self)
        other.cache, other.cached_ids, other.unremembered, other.dropped = None, [], None, 0
        other.head = self.head.for_sequence()
        return other

    def for_another_engine(self) -> DraftModelProposer:
        other = self.fresh()
        other.prompt_memo = PromptMemo()
        return other

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.dropped = max(0, len(prompt_ids) - self.sinks - self.window) if self.window else 0
        self.cache = self.model.new_cache(capacity - self.dropped, self.num_layers)
        view = self.view(prompt_ids)
        reused = self.prompt_memo.restore(self._memo_keys(view), self.cache)
        self.cached_ids = view[:reused]
        self.unremembered = view
        self.head.reset()  # (a new sequence: its own context's columns)

    def view(self, context: list[int]) -> list[int]:
        """What the draft reads of `context` (which starts with this sequence's prompt): the context
        without the prompt's dropped middle."""
        if not self.dropped:
            return list(context)
        return context[: self.sinks] + context[self.sinks + self.dropped :]

    def _positions(self, start: int, count: int) -> torch.Tensor:
        """Positions of the view's entries start .. start + count - 1: real ones (past the sinks, shifted
        by the dropped middle) unless renumbered."""
        positions = torch.arange(start, start + count)
        if self.dropped and not self.renumber:
            positions = positions + self.dropped * (positions >= self.sinks)
        return positions

    def _memo_keys(self, view: list[int]) -> list:
        """What identifies the view's cache rows for the prompt memo: the tokens, and their positions
        where the dropped middle shifts them."""
        if not self.dropped or self.renumber:
            return view
        return list(zip(view, self._positions(0, len(view)).tolist()))

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` after the cached ones; logits of the last, [1, vocab]."""
        start = self.cache.length
        device = self.model.device  # (a GPU target's layerskip draft, or a draft loaded on the GPU)
        hidden = self.model(
            torch.tensor(tokens, device=device),
            self._positions(start, len(tokens)).to(device),
            self.cache,
            AttentionMetadata(start, len(tokens)),
            num_layers=self.num_layers,
        )
        self.cache.truncate(start + len(tokens))
        self.cached_ids.extend(tokens)
        logits = self.head.logits(hidden[-1:])  # [1, vocab], or [1, columns] over the token map and the context
        return logits if logits.device.type == "cpu" else logits.cpu()  # drawn with the request's CPU generator

    def _agreeing(self, view: list[int]) -> int:
        """How many of the cached tokens to keep for `view`: the prefix that agrees with it, short of its
        last token (always re-fed for its logits)."""
        keep = 0
        limit = min(len(self.cached_ids), len(view) - 1)
        while keep < limit and self.cached_ids[keep] == view[keep]:
            keep += 1
        return keep

    def catch_up_seconds(self, context: list[int]) -> float:
        if len(context) - self.dropped - len(self.cached_ids) < CatchUpRate.MIN_TOKENS:  # a step's few new tokens
            return 0.0
        view = self.view(context)
        return self.catch_up_rate.seconds(len(view) - self._agreeing(view))

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Keep the cached prefix that agrees with the committed context (its view), feed the rest; the
        logits after the context's last token ([1, vocab] or over the token map)."""
        self.head.add_context(context)
        context = self.view(context)
        keep = self._agreeing(context)
        self.cache.truncate(keep)
        del self.cached_ids[keep:]
        t0 = time.perf_counter()
        logits = self._feed(context[keep:])
        self.catch_up_rate.record(len(context) - keep, time.perf_counter() - t0)
        prompt = self.unremembered
        if prompt is not None and self.cached_ids[: len(prompt)] == prompt:  # the whole prompt is cached now
            self.prompt_memo.remember(self._memo_keys(prompt), self.cache)
            self.unremembered = None
        return logits

    def sync(self, context: list[int]) -> None:
        """Catch the cache up on the committed context without drafting (another proposer drafts this step)."""
        self._catch_up(context)

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        logits = self._catch_up(context)
        if self.grammar is not None:
            return self._propose_under_grammar(logits, k, params, generator)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        sure = 1.0  # the product of the draft's top probabilities along the chain
        for i in range(k):
            if params.greedy:
                token = self.head.token(int(logits.argmax(-1)))
                top = float(torch.softmax(logits[0], dim=-1).max()) if self.stop else 1.0
            else:
                q = self.head.full_vocab(processed_probs(logits, params))  # [1, vocab]
                token = int(sample_from_probs(q, generator))
                probs.append(q[0])
                top = float(q[0].max())
            tokens.append(token)
            sure *= top
            if i + 1 < k and sure >= self.stop:
                logits = self._feed([token])
            else:
                break
        return Proposal(tokens, torch.stack(probs) if probs else None)

    def _propose_under_grammar(
        self, logits: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """The chain drawn from the draft's masked distribution (`grammar`, a GrammarMatcher at the
        context's end, advanced over each draft and rolled back after): every draft is one the grammar
        allows, and q is the distribution it was really drawn from, so verification stays exact. Stops
        at a dead end and after an EOS."""
        grammar, tokens, probs, advanced, sure = self.grammar, [], [], 0, 1.0
        try:
            for i in range(k):
                with grammar.timed():
                    mask = self.head.mask(grammar.allowed_mask())  # [V] or [V'] over the token map
                    if not mask.any():
                        break
                    masked = mask_logits(logits, mask[None])
                if params.greedy:
                    token = self.head.token(int(masked.argmax(-1)))
                else:
                    q = self.head.full_vocab(processed_probs(masked, params))  # [1, vocab]
                    token = int(sample_from_probs(q, generator))
                    probs.append(q[0])
                tokens.append(token)
                sure *= float(torch.softmax(masked[0], dim=-1).max()) if params.greedy else float(q[0].max())
                if token in grammar.vocab.eos_token_ids or grammar.advance([token]) != 1:
                    break
                advanced += 1
                if i + 1 < k and sure >= self.stop:
                    logits = self._feed([token])
                else:
                    break
        finally:
            grammar.rollback(advanced)
        return Proposal(tokens, torch.stack(probs) if probs else None)


class DraftTreeProposer(DraftModelProposer):
    """A draft model's chain with its second choice as an extra leaf wherever it is unsure (top-1
    probability below `branch`): those rows cost no extra draft pass (the logits are there), only
    verification rows, and catch the target's choice where the draft's first guess misses. Greedy
    requests only; sampled ones get the exact sampled chain. K is the node budget (chain + leaves).

    Under a grammar (`grammar` set) every node is masked: the chain's node and its runner-up are the
    draft's two best tokens among those the grammar allows after the chain so far (and "unsure" is
    judged on that masked distribution); the chain stops at an EOS or a dead end."""

    proposes_trees = True

    def __init__(self, model: LlamaModel, branch: float, **kwargs) -> None:
        super().__init__(model, **kwargs)
        if not 0.0 < branch < 1.0:
            raise ValueError(f"draft branch threshold must be in (0, 1), got {branch}")
        self.branch = branch

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        if not params.greedy:
            return super().propose(context, k, params, generator)
        logits = self._catch_up(context)
        grammar, advanced = self.grammar, 0
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        try:
            while len(tokens) < k:
                if grammar is not None:  # this node's choices: the tokens the grammar allows after the chain
                    with grammar.timed():
                        mask = self.head.mask(grammar.allowed_mask())  # [V] or [V'] over the token map
                        if not mask.any():
                            break
                        logits = mask_logits(logits, mask[None])
                top = torch.topk(torch.softmax(logits[0].float(), dim=-1), 2)
                tokens.append(self.head.token(int(top.indices[0])))
                parents.append(parent)
                node = len(tokens) - 1
                # unsure: the runner-up as a leaf (masked, a runner-up outside the grammar has probability 0)
                if float(top.values[0]) < self.branch and float(top.values[1]) > 0 and len(tokens) < k:
                    tokens.append(self.head.token(int(top.indices[1])))
                    parents.append(parent)
                parent = node
                if grammar is not None:
                    if tokens[node] in grammar.vocab.eos_token_ids or grammar.advance([tokens[node]]) != 1:
                        break
                    advanced += 1
                if len(tokens) < k:
                    logits = self._feed([tokens[node]])
        finally:
            if grammar is not None:
                grammar.rollback(advanced)
        return Proposal(tokens, None, parents)
