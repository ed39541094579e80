"""Synthetic tree proposers for tests: the true continuation hidden among distractors, and trees drawn
from a known draft distribution; randomly perturbed Medusa / EAGLE heads."""

from __future__ import annotations

import random

import torch

from speclm.models.config import ModelConfig
from speclm.speculative.heads import EagleHead, MedusaHeads, save_head
from speclm.speculative.proposer import Proposal, Proposer


def write_perturbed_heads(config: ModelConfig, root) -> dict[str, str]:
    """Randomly perturbed Medusa (3 heads, 64-token subset) and EAGLE (token_map) heads for a target
    of `config`, saved under root; {"medusa": dir, "eagle": dir}. Exactness must not depend on head quality."""
    g = torch.Generator().manual_seed(0)
    medusa = MedusaHeads(
        config.hidden_size, config.vocab_size, 3, token_map=torch.randperm(config.vocab_size, generator=g)[:64]
    )
    eagle = EagleHead(config, token_map=torch.arange(0, config.vocab_size, 2))
    for head, scale in ((medusa, 0.2), (eagle, 0.5)):
        for p in head.parameters():
            p.data += scale * torch.randn(p.shape, generator=g)
    return {"medusa": str(save_head(medusa, root / "medusa")), "eagle": str(save_head(eagle, root / "eagle"))}


class OracleTreeProposer(Proposer):
    """Proposes random trees of up to k nodes in which the reference (plain greedy) continuation
    runs down a random number of levels, at a random sibling position among distractors, so
    verification must find it at any depth; distractor subtrees hang off other nodes as well."""

    name = "oracle-tree"
    proposes_trees = True

    def __init__(self, reference: list[int], vocab_size: int, seed: int = 0, max_branching: int = 3) -> None:
        self.reference, self.vocab_size, self.max_branching = reference, vocab_size, max_branching
        self.rng = random.Random(seed)
        self.accepted: list[int] = []

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        assert prompt_ids == self.reference[: len(prompt_ids)]

    def _distractor(self, avoid: int | None) -> int:
        while True:
            t = self.rng.randrange(self.vocab_size)
            if t != avoid:
                return t

    def propose(self, context, k, params, generator) -> Proposal:
        assert context == self.reference[: len(context)], "the engine committed a token plain greedy did not"
        truth = self.reference[len(context) : len(context) + k]
        true_depth = self.rng.randint(0, len(truth))  # the truth runs this many levels, then stops
        tokens, parents, true_node = [], [], -1
        level = [-1]  # nodes of the previous level
        for depth in range(1, k + 1):
            next_level = []
            for parent in level:
                on_path = parent == true_node
                width = self.rng.randint(1 if on_path else 0, self.max_branching)
                slot = self.rng.randrange(width) if on_path and depth <= true_depth else -1
                avoid = truth[depth - 1] if on_path and depth <= len(truth) else None
                for j in range(width):
                    if len(tokens) == k:
                        break
                    tokens.append(truth[depth - 1] if j == slot else self._distractor(avoid))
                    parents.append(parent)
                    if j == slot:
                        true_node = len(tokens) - 1
                    next_level.append(len(tokens) - 1)
            if not next_level or len(tokens) == k:
                break
            level = next_level
        return Proposal(tokens, None, parents)

    def update(self, num_accepted: int) -> None:
        self.accepted.append(num_accepted)


class TableTreeProposer(Proposer):
    """Drafts a depth-2 tree at the first step only, from known draft distributions: q1 at the
    prompt and q2[x] after the prompt plus x. mode 'sampled' draws siblings independently from q
    (and returns the q rows), 'topk' proposes the most likely tokens deterministically."""

    name = "table-tree"
    proposes_trees = True

    def __init__(
        self,
        prompt_len: int,
        q1: torch.Tensor,
        q2: dict[int, torch.Tensor],
        mode: str,
        widths: tuple[int, int] = (3, 2),
    ) -> None:
        self.prompt_len, self.q1, self.q2, self.mode, self.widths = prompt_len, q1, q2, mode, widths

    def start(self, prompt_ids, capacity) -> None:
        pass

    def _children(self, q: torch.Tensor, width: int, generator) -> list[int]:
        if self.mode == "sampled":
            return torch.multinomial(q, width, replacement=True, generator=generator).tolist()
        return torch.topk(q, width).indices.tolist()

    def propose(self, context, k, params, generator) -> Proposal:
        if len(context) != self.prompt_len:
            return Proposal()
        tokens, parents, rows = [], [], []
        for x in self._children(self.q1, self.widths[0], generator):
            tokens.append(x), parents.append(-1), rows.append(self.q1)
        for node in range(len(tokens)):
            q = self.q2[tokens[node]]
            for y in self._children(q, self.widths[1], generator):
                tokens.append(y), parents.append(node), rows.append(q)
        probs = torch.stack(rows) if self.mode == "sampled" else None
        return Proposal(tokens[:k], None if probs is None else probs[:k], parents[:k])

    def update(self, num_accepted: int) -> None:
        pass
