"""Medusa proposer (medusa:PATH): K parallel heads on the target's last feature draft a static token tree."""

from __future__ import annotations

import copy
import heapq

import torch

from speclm.models.llama import LlamaModel
from speclm.sampling_params import SamplingParams
from speclm.speculative.heads import MedusaHeads, draft_lm_head
from speclm.speculative.proposer import Proposal, Proposer

DEPTH_PRIOR = 0.6  # assumed acceptance of a head's top token, per level


def rank_prior(rank: int) -> float:
    """Assumed share of acceptances going to a head's rank-th token (rank 0 = its top token)."""
    return 1.0 / (1 + rank) ** 1.5


def static_tree(num_heads: int, num_nodes: int, width: int) -> list[tuple[int, ...]]:
    """The num_nodes most promising paths of head ranks, best first: a path (r1, ..., rd) is the
    rank-r1 token of head 0, then the rank-r2 token of head 1, ... Its score is the product of
    DEPTH_PRIOR * rank_prior(r) along it, so every path comes after its prefixes (parents first)."""
    paths: list[tuple[int, ...]] = []
    heap = [(-DEPTH_PRIOR * rank_prior(r), (r,)) for r in range(width)]
    heapq.heapify(heap)
    while heap and len(paths) < num_nodes:
        neg_score, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < num_heads:
            for r in range(width):
                heapq.heappush(heap, (neg_score * DEPTH_PRIOR * rank_prior(r), path + (r,)))
    return paths


class MedusaProposer(Proposer):
    """Drafts the target's next tokens from its last committed feature f_{L-2} (the pending token's
    predecessor): the target's own logits there give the pending token, head i gives depth i+1.
    K is the node budget: the first K paths of `static_tree`; width 1 makes it a chain. Candidates
    are the heads' top tokens (deterministic), which the verifier handles exactly when sampling."""

    wants_features = True
    feature_history = False  # drafts from the last feature only
    proposes_trees = True

    def __init__(self, target: LlamaModel, heads: MedusaHeads, width: int = 3, name: str = "medusa") -> None:
        if width < 1:
            raise ValueError(f"medusa width must be >= 1, got {width}")
        self.heads, self.name = heads, name
        self.lm_head = draft_lm_head(target.lm_head, heads.token_map)
        self.token_map = heads.token_map
        self.width = min(width, heads.vocab_size if heads.token_map is None else heads.token_map.numel())
        self._trees: dict[int, tuple[list[int], list[tuple[int, ...]]]] = {}
        self.feature: torch.Tensor | None = None

    def fresh(self) -> MedusaProposer:
        """A proposer for another sequence sharing these heads, output head and trees (the batched
        engine keeps one per sequence; building the subset output head again would copy weights)."""
        other = copy.copy(self)
        other.feature = None
        return other

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.feature = None

    def add_features(self, features: torch.Tensor) -> None:  # [n, hidden]
        self.feature = features[-1:]

    def tree_depth(self, k: int) -> int:
        """Depth of the k-node tree (for the adaptive controller)."""
        return max(len(p) for p in self._tree(k)[1])

    def _tree(self, k: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """(parents, paths) of the k-node static tree, cached per k."""
        if k not in self._trees:
            paths = static_tree(self.heads.num_heads, k, self.width)
            index = {p: i for i, p in enumerate(paths)}
            self._trees[k] = ([index.get(p[:-1], -1) for p in paths], paths)
        return self._trees[k]

    @torch.inference_mode()
    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        if self.feature is None:  # a one-token prompt: no feature until the first verification
            return Proposal()
        parents, paths = self._tree(k)
        depth = max(len(p) for p in paths)
        hidden = torch.cat([self.heads.heads[i](self.feature) for i in range(depth)])  # [depth, hidden]
        logits = self.lm_head(hidden).float()  # [depth, V or V']
        ranks = torch.topk(logits, self.width, dim=-1).indices  # [depth, width]
        if self.token_map is not None:
            ranks = self.token_map[ranks]  # subset columns -> token ids
        ranks = ranks.tolist()
        return Proposal([ranks[len(p) - 1][p[-1]] for p in paths], None, parents)
