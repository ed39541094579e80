"""One sequence's position in its grammar (llguidance's LLMatcher behind our interface): the tokens the
grammar allows next as a mask over the model's vocabulary, advance, rollback, forced tokens, and the
grammar's verdict on draft chains and draft trees."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from contextlib import contextmanager

import llguidance
import numpy as np
import torch

from speclm.sample.tree import TokenTree
from speclm.structured.grammar import Constraint, ConstraintError
from speclm.tokenizer import Tokenizer


class GrammarVocab:
    """The tokenizer as llguidance sees it (each token's bytes, EOS ids), and the model's vocabulary size.

    Built from the tokenizers-library backend our Tokenizer wraps (GGUF, tokenizer.json and llama2.c
    models alike). Building costs ~1 s for a 49k vocabulary and several seconds for 151k: use
    `GrammarVocab.of(tokenizer, vocab_size)`, which builds once per tokenizer and vocabulary size."""

    _cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None) -> None:
        self.tokenizer_vocab_size = tokenizer.vocab_size
        # The model's logits may have more rows than the tokenizer has tokens (padding): never allowed.
        self.vocab_size = max(vocab_size or 0, self.tokenizer_vocab_size)
        self.eos_token_ids = list(tokenizer.eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("structured outputs need a tokenizer with an EOS token")
        self.lltokenizer = llguidance.LLTokenizer(
            tokenizer.backend.to_str(), n_vocab=self.tokenizer_vocab_size, eos_token=self.eos_token_ids
        )

    @classmethod
    def of(cls, tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarVocab:
        """The cached GrammarVocab of `tokenizer` (built on first use)."""
        with cls._lock:
            per_size = cls._cache.setdefault(tokenizer, {})
            if vocab_size not in per_size:
                per_size[vocab_size] = cls(tokenizer, vocab_size)
            return per_size[vocab_size]

    def token_bytes(self, token_id: int) -> bytes:
        return self.lltokenizer.decode_bytes([token_id])


def _timed(method):
    """Count the method's time in the matcher's `seconds` (see GrammarMatcher.timed)."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        with self.timed():
            return method(self, *args, **kwargs)

    return timed


class GrammarMatcher:
    """Where one sequence stands in its constraint. Not thread-safe; one per sequence (and sample).

    `seconds` is the time spent in its work (masks, advancing, rolling back, forced tokens, draft checks)
    and in what callers time with `timed()` (applying its masks to logits): the grammar's cost."""

    def __init__(self, vocab: GrammarVocab, constraint: Constraint) -> None:
        self.vocab = vocab
        self.constraint = constraint
        self._matcher = llguidance.LLMatcher(vocab.lltokenizer, constraint.grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError("grammar", self._matcher.get_error())
        self._words = (vocab.tokenizer_vocab_size + 31) // 32
        self._bitmask = np.zeros(self._words, dtype=np.int32)  # [words]: bit j of word i = token 32 i + j
        self.num_tokens = 0  # tokens advanced over (what rollback may undo)
        self.seconds = 0.0
        self._timing = False

    @contextmanager
    def timed(self):
        """Count the block's time in `seconds` (once: nested timed blocks are inside the outer one)."""
        if self._timing:
            yield
            return
        self._timing, t0 = True, time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - t0
            self._timing = False

    # -- state ------------------------------------------------------------------------------
    def is_accepting(self) -> bool:
        """The tokens so far form a complete match: EOS is allowed now."""
        return self._matcher.is_accepting()

    def is_terminated(self) -> bool:
        """Nothing but EOS can follow (the grammar is complete), or the matcher hit an error."""
        return self._matcher.is_stopped()

    def error(self) -> str | None:
        """The matcher's error (a token outside the grammar was forced on it), None when healthy."""
        return self._matcher.get_error() if self._matcher.is_error() else None

    # -- masks --------------------------------------------------------------------------------
    @_timed
    def allowed_mask(self) -> torch.Tensor:
        """[vocab_size] bool: True where the grammar allows the token next (EOS only when accepting).
        All False means a dead end (the engine ends the request)."""
        if self._matcher.is_error():
            return torch.zeros(self.vocab.vocab_size, dtype=torch.bool)
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._words * 4)
        return self._unpack(self._bitmask)

    def _unpack(self, bitmask: np.ndarray) -> torch.Tensor:
        # numpy, not torch: torch splits a 151k-element op over its thread pool, which costs more than the
        # op (and far more while another pool holds the cores); unpackbits is one pass on one thread.
        bits = np.unpackbits(bitmask.view(np.uint8), count=self.vocab.tokenizer_vocab_size, bitorder="little")
        mask = np.zeros(self.vocab.vocab_size, dtype=np.bool_)  # [vocab_size]
        mask[: len(bits)] = bits
        return torch.from_numpy(mask)

    # -- moving --------------------------------------------------------------------------------
    @_timed
    def advance(self, tokens: list[int]) -> int:
        """Consume tokens up to the first the grammar rejects; returns how many were consumed."""
        n = self.valid_prefix_length(tokens)
        if n and not self._matcher.consume_tokens(list(tokens[:n])):
            raise AssertionError(f"llguidance refused tokens it validated: {self._matcher.get_error()}")
        self.num_tokens += n
        return n

    @_timed
    def rollback(self, n: int) -> None:
        """Undo the last n advanced tokens (verification rejected them)."""
        if not 0 <= n <= self.num_tokens:
            raise ValueError(f"cannot roll back {n} tokens, {self.num_tokens} were advanced")
        if n and not self._matcher.rollback(n):
            raise AssertionError(f"llguidance rollback of {n} failed: {self._matcher.get_error()}")
        self.num_tokens -= n

    @_timed
    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (jump-forward), in canonical tokenization: free drafts.

        Only tokens the matcher itself would accept are returned (a forced literal that equals a special
        token's text is tokenized to that token, which a literal does not match)."""
        if self._matcher.is_error() or self._matcher.is_stopped():
            return []
        forced = self._matcher.compute_ff_tokens()
        return forced[: self.valid_prefix_length(forced)]

    # -- drafts ---------------------------------------------------------------------------------
    @_timed
    def valid_prefix_length(self, tokens: list[int]) -> int:
        """How many of `tokens` (a draft chain after the current state) the grammar accepts in a row:
        cut the chain there. EOS counts as valid only where the grammar is accepting."""
        tokens = list(tokens)
        limit = next((i for i, t in enumerate(tokens) if not 0 <= t < self.vocab.tokenizer_vocab_size), len(tokens))
        if self._matcher.is_error() or limit == 0:
            return 0
        n = self._matcher.validate_tokens(tokens[:limit])
        if n < limit and tokens[n] in self.vocab.eos_token_ids:  # llguidance counts no EOS once stopped
            n += self._accepting_after(tokens[:n])
        return n

    def _accepting_after(self, tokens: list[int]) -> bool:
        if not tokens:
            return self._matcher.is_accepting()
        self._matcher.consume_tokens(tokens)
        accepting = self._matcher.is_accepting()
        self._matcher.rollback(len(tokens))
        return accepting

    @_timed
    def valid_nodes(self, tree: TokenTree, draft_tokens: list[int]) -> list[int]:
        """The nodes of a draft tree (a chain is one) that the grammar accepts on their path from the
        current state, in order: cut the rest. Below a rejected node or an EOS nothing is valid, so what
        is kept is a tree (ancestors first). The matcher's state is the same before and after."""
        assert tree.num_nodes == len(draft_tokens)
        valid: list[int] = []
        children = tree.children()
        stack: list[tuple[int, bool]] = [(c, True) for c in reversed(children[0])]  # (node, entering)
        while stack:
            node, entering = stack.pop()
            if not entering:
                self.rollback(1)
                continue
            token = draft_tokens[node]
            if self.valid_prefix_length([token]) != 1:
                continue
            valid.append(node)
            if token in self.vocab.eos_token_ids:
                continue
            self.advance([token])
            stack.append((node, False))
            stack.extend((c, True) for c in reversed(children[node + 1]))
        return sorted(valid)

    @_timed
    def tree_masks(self, tree: TokenTree, draft_tokens: list[int]) -> tuple[torch.Tensor, list[bool]]:
        """Per-row masks of a draft tree's verification pass, and which nodes the grammar accepts.

        masks[0] is the mask at the current state (the pending row), masks[1 + i] the mask after node i.
        A node the grammar rejects (or below one, or below an EOS) is invalid; its row's mask is all True,
        a placeholder that keeps softmax finite: the row is unreachable, as the node's token is masked out
        at its parent. An allowed EOS node is valid and its row a placeholder too (the sequence ends there).
        The matcher's state is the same before and after."""
        assert tree.num_nodes == len(draft_tokens)
        vocab = self.vocab.vocab_size
        masks = torch.ones(tree.num_nodes + 1, vocab, dtype=torch.bool)  # [num_nodes + 1, vocab]
        valid = [False] * tree.num_nodes
        masks[0] = self.allowed_mask()
        children = tree.children()
        stack: list[tuple[int, bool]] = [(c, True) for c in reversed(children[0])]  # (node, entering)
        while stack:
            node, entering = stack.pop()
            if not entering:
                self._matcher.rollback(1)
                continue
            token = draft_tokens[node]
            if not (0 <= token < self.vocab.tokenizer_vocab_size and masks[_parent_row(tree, node)][token]):
                continue  # invalid: its subtree stays invalid and all-True
            if token in self.vocab.eos_token_ids:  # allowed here, and the end: nothing below it is valid
                valid[node] = True
                continue
            if not self._matcher.consume_token(token):
                raise AssertionError(f"llguidance refused a token its mask allowed: {self._matcher.get_error()}")
            valid[node] = True
            masks[node + 1] = self.allowed_mask()
            stack.append((node, False))
            stack.extend((c, True) for c in reversed(children[node + 1]))
        return masks, valid


def _parent_row(tree: TokenTree, node: int) -> int:
    return tree.parents[node] + 1
