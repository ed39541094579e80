"""EAGLE proposer (eagle:PATH): a one-layer feature-level head drafts a chain or an EAGLE-2 dynamic tree."""

from __future__ import annotations

import copy

import torch

from speclm.kv.cache import KVCache
from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams
from speclm.speculative.heads import EagleHead, draft_lm_head
from speclm.speculative.proposer import Proposal, Proposer


class EagleProposer(Proposer):
    """Keeps the head's own KV cache in sync with the committed context: row t (slot t, position
    t+1) is fc([f_t; embed(x_{t+1})]) for every committed t with a target feature, appended as the
    engine hands features over. Drafting continues from the last row's predicted feature:

    - chain (topk = 1): k tokens, each row fed its predecessor's predicted feature and token;
    - tree (EAGLE-2): at every depth the `topk` most likely children of the `beam` best nodes by
      cumulative draft log-probability are drafted; the head runs once per depth over the beam
      (tree attention over the cache and each node's ancestors); finally the k best nodes overall
      are kept (a child never scores above its parent, so they form a tree).

    Tree candidates are deterministic (the head's top tokens); sampling stays exact through the tree
    verifier's deterministic-candidate scheme. A sampled chain draws from the head's processed
    distribution and carries it for min(1, p/q) acceptance. Draft rows live past the committed rows and are
    dropped before the next proposal."""

    wants_features = True
    feature_history = True
    proposes_trees = True

    def __init__(
        self, target: LlamaModel, head: EagleHead, topk: int = 2, beam: int = 2, depth: int = 5, name: str = "eagle"
    ) -> None:
        if topk < 1 or beam < 1 or depth < 1:
            raise ValueError(f"eagle needs topk, beam and depth >= 1, got {topk}, {beam}, {depth}")
        self.head, self.embed, self.name = head, target.embed_tokens, name
        # The head's rows compute in its input embeddings' dtype (fp32 from a GGUF table, else the table's).
        self.act_dtype = self.embed(torch.zeros(1, dtype=torch.long)).dtype
        self.device = target.device
        self.lm_head = draft_lm_head(target.lm_head, head.token_map)
        self.token_map = head.token_map
        self.topk, self.beam, self.depth = topk, beam, depth
        self.cache = None
        self.rows = 0  # committed rows in the head's cache
        self.pending: list[torch.Tensor] = []  # features not yet turned into rows
        self.last: torch.Tensor | None = None  # the last committed row's predicted feature, [hidden]

    def fresh(self) -> EagleProposer:
        """A proposer for another sequence sharing this one's head and output head, with its own
        (not yet started) draft cache: the batched engine keeps one per sequence."""
        other = copy.copy(self)
        other.cache, other.rows, other.pending, other.last = None, 0, [], None
        return other

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        c, slots = self.head.target_config, capacity + self.beam * self.depth + 1
        self.cache = KVCache(1, c.num_kv_heads, c.head_dim, slots, self.act_dtype, self.device)
        self.rows, self.pending, self.last = 0, [], None

    def add_features(self, features: torch.Tensor) -> None:  # [n, hidden]
        self.pending.append(features)

    def _run(
        self, features: torch.Tensor, tokens: list[int], positions: list[int], start: int, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Head rows at cache slots start..; [n, hidden] predicted features."""
        n = len(tokens)
        embeds = self.embed(torch.tensor(tokens))
        return self.head(features, embeds, torch.tensor(positions), self.cache, AttentionMetadata(start, n, mask))

    def tree_depth(self, k: int) -> int:
        """The deepest a k-node draft can reach (for the adaptive controller; EAGLE-2 trees vary)."""
        return k if self.topk == 1 else min(self.depth, k)

    def _sync(self, context: list[int]) -> None:
        """Turn the pending features into committed rows (f_t with x_{t+1} at position t+1)."""
        if not self.pending:
            return
        features = torch.cat(self.pending)  # [m, hidden]
        self.pending = []
        m, start = features.shape[0], self.rows
        assert start + m <= len(context) - 1, "features for positions past the committed context"
        mask = None
        if m > 1 and start > 0:  # one causal SDPA call (draft rows need no decoding-exact attention)
            mask = torch.arange(start + m)[None, :] <= torch.arange(start, start + m)[:, None]
        out = self._run(
            features, context[start + 1 : start + m + 1], list(range(start + 1, start + m + 1)), start, mask
        )
        self.rows = start + m
        self.cache.truncate(self.rows)
        self.last = out[-1]

    def _top(self, features: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top `count` (log-probabilities, token ids) per row of predicted features, [n, count] each."""
        logp = torch.log_softmax(self.lm_head(features).float(), dim=-1)
        values, index = torch.topk(logp, min(count, logp.shape[-1]), dim=-1)
        return values, (self.token_map[index] if self.token_map is not None else index)

    @torch.inference_mode()
    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        self._sync(context)
        if self.last is None:  # a one-token prompt: no feature until the first verification
            return Proposal()
        if self.topk == 1:
            return self._chain(context, k, params, generator)
        return self._tree(context, k)

    def _chain(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        """Greedy: the head's top token at each step. Sampling: a draw from the head's processed
        distribution q (over the full vocabulary; tokens outside a token_map get q = 0), returned
        with q so the verifier accepts with min(1, p/q)."""
        feature, tokens, probs, position = self.last[None], [], [], len(context)
        for i in range(k):
            if params.greedy:
                _, top = self._top(feature, 1)
                tokens.append(int(top[0, 0]))
            else:
                q = processed_probs(self._full_vocab_logits(feature), params)  # [1, vocab]
                tokens.append(int(sample_from_probs(q, generator)))
                probs.append(q[0])
            if i + 1 < k:
                feature = self._run(feature, tokens[-1:], [position + i], self.rows + i, None)
        return Proposal(tokens, torch.stack(probs) if probs else None, list(range(-1, k - 1)))

    def _full_vocab_logits(self, features: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab]
        logits = self.lm_head(features).float()
        if self.token_map is None:
            return logits
        full = logits.new_full((logits.shape[0], self.head.vocab_size), float("-inf"))
        full[:, self.token_map] = logits
        return full

    def _tree(self, context: list[int], k: int) -> Proposal:
        scores: list[float] = []  # cumulative log-probability per node
        tokens: list[int] = []
        parents: list[int] = []
        slot_of: dict[int, int] = {}  # node -> its head row's cache slot (expanded nodes only)
        values, top = self._top(self.last[None], self.topk)
        frontier = []
        for v, t in zip(values[0].tolist(), top[0].tolist()):
            frontier.append(len(tokens))
            scores.append(v), tokens.append(t), parents.append(-1)
        features = {-1: self.last}
        next_slot, position = self.rows, len(context)
        for d in range(1, min(self.depth, k)):  # a node at depth > k could never be kept
            expand = sorted(frontier, key=lambda i: -scores[i])[: min(self.beam, k)]
            n = len(expand)
            # Each row sees the committed rows, its expanded ancestors and itself.
            mask = torch.zeros(n, next_slot + n, dtype=torch.bool)
            mask[:, : self.rows] = True
            for r, node in enumerate(expand):
                a = parents[node]
                while a != -1:
                    mask[r, slot_of[a]] = True
                    a = parents[a]
                mask[r, next_slot + r] = True
                slot_of[node] = next_slot + r
            out = self._run(
                torch.stack([features[parents[i]] for i in expand]),
                [tokens[i] for i in expand],
                [position + d - 1] * n,
                next_slot,
                mask,
            )  # [n, hidden]
            next_slot += n
            values, top = self._top(out, self.topk)
            frontier = []
            for r, node in enumerate(expand):
                features[node] = out[r]
                for v, t in zip(values[r].tolist(), top[r].tolist()):
                    frontier.append(len(tokens))
                    scores.append(scores[node] + v), tokens.append(t), parents.append(node)
        # The k best nodes; ties go to the shallower node, so parents always rank before children.
        depth = [0] * len(tokens)
        for i, p in enumerate(parents):
            depth[i] = 0 if p == -1 else depth[p] + 1
        keep = sorted(sorted(range(len(tokens)), key=lambda i: (-scores[i], depth[i]))[:k])
        index = {old: new for new, old in enumerate(keep)}
        self.cache.truncate(self.rows)
        return Proposal([tokens[i] for i in keep], None, [index[parents[i]] if parents[i] != -1 else -1 for i in keep])
