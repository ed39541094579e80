"""Training objectives over cached target data: a draft model (KD/GKD), Medusa heads, an EAGLE head.

Teacher distributions are lm_head(cached features) through the target's fp32 head. With a token_map
both teacher and student logits are taken over the map's V' tokens only (the teacher renormalized
over the subset): the drafter only ever proposes those tokens, so that is the distribution it needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speclm.distill.data import TargetData
from speclm.distill.losses import FeatureDistillation, distillation_loss, forward_kl, masked_mean
from speclm.distill.student import training_hidden_states
from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.speculative.heads import EagleHead, MedusaHeads


class HeadSpace:
    """The output space drafters train in: the frozen fp32 head weight [V or V', hidden] and the
    map from full-vocabulary ids to its rows (-1 outside the token map)."""

    def __init__(self, head_weight: torch.Tensor, token_map: torch.Tensor | None) -> None:
        vocab = head_weight.shape[0]
        self.token_map = token_map
        self.weight = (head_weight if token_map is None else head_weight[token_map]).detach().float()
        self.index_of = torch.arange(vocab) if token_map is None else torch.full((vocab,), -1, dtype=torch.long)
        if token_map is not None:
            self.index_of[token_map] = torch.arange(token_map.numel())

    def logits(self, features: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, V']
        return F.linear(features.float(), self.weight)

    def labels(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids -> (rows of the head [n], mask [n] of the ids inside the map)."""
        rows = self.index_of[tokens]
        return rows.clamp_min(0), rows >= 0


def pick_sequences(data: TargetData, batch_size: int, max_len: int, generator: torch.Generator):
    """`batch_size` random sequences (tokens [n], features [n, h], prompt length), each cut to its
    last max_len tokens, keeping the response whole where it fits."""
    return [
        cut_sequence(data, i, max_len) for i in torch.randint(len(data), (batch_size,), generator=generator).tolist()
    ]


def cut_sequence(data: TargetData, i: int, max_len: int):
    """Sequence i (tokens [n], features [n, h], prompt length) cut to its last max_len tokens."""
    tokens, features, prompt_len = data.sequence(i)
    cut = max(0, tokens.numel() - max_len)
    return tokens[cut:], features[cut:], max(1, prompt_len - cut)


def _same_map(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


class DraftObjective:
    """A small LlamaModel student distilled from the target: divergence (fkl/rkl/jsd at temperature T,
    alpha hard CE) on the target's response positions, optionally on its own samples scored by the
    teacher with probability `on_policy` (GKD's lambda; needs `teacher`), optionally plus a feature loss
    between the student's and the target's final hidden states (weight `feature_weight`). The student
    scores through the target's head (`space`) unless it has a frozen head of its own (`student_space`,
    over the same token map: a separate draft model being fitted to this target)."""

    def __init__(
        self,
        student: LlamaModel,
        data: TargetData,
        space: HeadSpace,
        divergence: str = "fkl",
        alpha: float = 0.0,
        temperature: float = 1.0,
        beta: float = 0.5,
        on_policy: float = 0.0,
        teacher: LlamaModel | None = None,
        feature_weight: float = 0.0,
        batch_size: int = 4,
        max_len: int = 512,
        sample_tokens: int = 64,
        student_space: HeadSpace | None = None,
    ) -> None:
        if not 0.0 <= on_policy <= 1.0:
            raise ValueError(f"--on-policy (GKD lambda) must be in [0, 1], got {on_policy}")
        if on_policy > 0 and teacher is None:
            raise ValueError("on-policy distillation needs the teacher model to score student samples")
        h = student.config.hidden_size
        self.features = FeatureDistillation(h, h, [0], [0]) if feature_weight > 0 else None
        self.module = nn.ModuleDict({"student": student} | ({"features": self.features} if self.features else {}))
        self.student, self.data, self.space, self.teacher = student, data, space, teacher
        if student_space is not None and not _same_map(student_space.token_map, space.token_map):
            raise ValueError("the student's head must score the same token map as the teacher's")
        self.student_space = student_space or space
        self.kd = dict(divergence=divergence, alpha=alpha, temperature=temperature, beta=beta)
        self.on_policy, self.feature_weight = on_policy, feature_weight
        self.batch_size, self.max_len, self.sample_tokens = batch_size, max_len, sample_tokens

    def _student_sample(self, prompt: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A continuation drawn from the student at temperature 1 (inside its token map) [<= sample_tokens]."""
        model, n = self.student, prompt.numel()
        cache = model.new_cache(n + self.sample_tokens)
        hidden = model(prompt, torch.arange(n), cache, AttentionMetadata(0, n))[-1:]
        out = []
        for i in range(self.sample_tokens):
            probs = torch.softmax(self.student_space.logits(hidden), dim=-1)  # [1, V']
            row = int(torch.multinomial(probs, 1, generator=generator))
            token = row if self.space.token_map is None else int(self.space.token_map[row])
            out.append(token)
            if token in model.config.eos_token_ids or i + 1 == self.sample_tokens:
                break
            cache.truncate(n + i)
            hidden = model(torch.tensor([token]), torch.tensor([n + i]), cache, AttentionMetadata(n + i, 1))
        return torch.tensor(out)

    def loss(self, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        total, agree, rows_seen, feats = 0.0, 0, 0, 0.0
        for tokens, features, prompt_len in pick_sequences(self.data, self.batch_size, self.max_len, generator):
            if self.on_policy > 0 and float(torch.rand((), generator=generator)) < self.on_policy:
                with torch.no_grad():
                    tokens = torch.cat([tokens[:prompt_len], self._student_sample(tokens[:prompt_len], generator)])
                    n = tokens.numel()
                    features = self.teacher(tokens, torch.arange(n), self.teacher.new_cache(n), AttentionMetadata(0, n))
            n = tokens.numel()
            hidden = training_hidden_states(self.student, tokens)  # [n, hidden]
            rows = torch.arange(prompt_len - 1, n - 1)  # these rows predict the response tokens
            student_logits = self.student_space.logits(hidden[rows])  # [r, V']
            with torch.no_grad():
                teacher_logits = self.space.logits(features[rows])
            labels, inside = self.space.labels(tokens[rows + 1])
            loss = distillation_loss(
                student_logits, teacher_logits, labels, mask=inside if self.kd["alpha"] else None, **self.kd
            )
            if self.features is not None:
                feature_loss = self.features([hidden[rows]], [features[rows].float()])
                loss = loss + self.feature_weight * feature_loss
                feats += float(feature_loss.detach()) / self.batch_size
            total = total + loss / self.batch_size
            agree += int((student_logits.argmax(-1) == teacher_logits.argmax(-1)).sum())
            rows_seen += rows.numel()
        stats = {"agree": agree / max(1, rows_seen)} | ({"feat": feats} if self.features is not None else {})
        return total, stats


class MedusaObjective:
    """Head i learns the target's distribution for token t+2+i from f_t: forward KL (T=1) to
    lm_head(f_{t+1+i}) mixed with hard CE on the target's greedy token by alpha; head i's loss is
    weighted decay**i (Medusa's schedule), over positions whose target token is in the response."""

    def __init__(
        self,
        heads: MedusaHeads,
        data: TargetData,
        space: HeadSpace,
        alpha: float = 0.0,
        decay: float = 0.8,
        batch_size: int = 8,
        max_len: int = 512,
    ) -> None:
        self.module = self.heads = heads
        self.data, self.space, self.alpha, self.decay = data, space, alpha, decay
        self.batch_size, self.max_len = batch_size, max_len

    def loss(self, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        k = self.heads.num_heads
        total, hits, counts = 0.0, [0] * k, [0] * k
        weights = [self.decay**i for i in range(k)]
        for tokens, features, prompt_len in pick_sequences(self.data, self.batch_size, self.max_len, generator):
            n = tokens.numel()
            first = max(0, prompt_len - 2)
            out = self.heads(features[first:])  # [k, n - first, hidden]
            for i in range(k):
                rows = torch.arange(max(first, prompt_len - 2 - i), n - 2 - i)  # token t+2+i is in the response
                if rows.numel() == 0:
                    continue
                student = self.space.logits(out[i, rows - first])  # [r, V']
                with torch.no_grad():
                    teacher = self.space.logits(features[rows + 1 + i])
                labels, inside = self.space.labels(tokens[rows + 2 + i])
                loss = distillation_loss(
                    student, teacher, labels, alpha=self.alpha, mask=inside if self.alpha else None
                )
                total = total + weights[i] * loss / (sum(weights) * self.batch_size)
                hits[i] += int(((student.argmax(-1) == labels) & inside).sum())
                counts[i] += rows.numel()
        return total, {f"acc{i}": hits[i] / max(1, counts[i]) for i in range(min(k, 2))}


class EagleObjective:
    """EAGLE's loss: row t reads fc([f_t + noise; embed(x_{t+1})]) at position t+1 and predicts f_{t+1}:
    smooth-L1 to f_{t+1} + ce_weight * forward KL of lm_head(prediction) to lm_head(f_{t+1}) (the
    target's distribution for x_{t+2}). Noise is uniform in [-noise, noise] on the input features.
    unroll=2 adds a second pass fed with the first pass's predicted features (as drafting feeds its
    predictions back), every row of it attending only to predicted features (a pessimistic context).
    `validation` (held-out sequences) is what validate() scores."""

    def __init__(
        self,
        head: EagleHead,
        embed: torch.Tensor,
        data: TargetData,
        space: HeadSpace,
        ce_weight: float = 0.1,
        noise: float = 0.1,
        unroll: int = 1,
        batch_size: int = 4,
        max_len: int = 512,
        validation: TargetData | None = None,
    ) -> None:
        if unroll not in (1, 2):
            raise ValueError(f"--unroll must be 1 or 2, got {unroll}")
        self.module = self.head = head
        self.embed = embed.detach().float()  # [vocab, hidden], the target's frozen token embeddings
        self.data, self.space, self.ce_weight, self.noise, self.unroll = data, space, ce_weight, noise, unroll
        self.batch_size, self.max_len, self.validation = batch_size, max_len, validation

    def _predict(self, inputs, tokens, offset):
        """Rows read inputs[t] with embed(tokens[t+offset]) and predict features[t+offset] [rows, hidden]."""
        rows = inputs.shape[0]
        return self.head(
            inputs,
            self.embed[tokens[offset : offset + rows]],
            torch.arange(offset, offset + rows),
            self.head.new_cache(rows),
            AttentionMetadata(0, rows),
        )

    def _pass(self, inputs, tokens, features, offset, mask, generator):
        """A noisy _predict scored against features[t+offset]: (pred, regression, ce, agreement)."""
        rows = inputs.shape[0]
        noisy = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * self.noise
        pred = self._predict(noisy, tokens, offset)  # [rows, hidden]
        target = features[offset : offset + rows]
        regression = masked_mean(F.smooth_l1_loss(pred, target, reduction="none").mean(-1), mask)
        if not mask.any():  # nothing to score (a response too short for this pass)
            return pred, regression, regression.new_zeros(()), regression.new_zeros(())
        student = self.space.logits(pred[mask])
        with torch.no_grad():
            teacher = self.space.logits(target[mask])
        ce = forward_kl(student, teacher)
        agree = (student.argmax(-1) == teacher.argmax(-1)).float().mean()
        return pred, regression, ce, agree

    def loss(self, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        total, stats = 0.0, {"reg": 0.0, "agree": 0.0}
        for tokens, features, prompt_len in pick_sequences(self.data, self.batch_size, self.max_len, generator):
            n = tokens.numel()
            mask = self._first_pass_rows(n, prompt_len)
            pred, regression, ce, agree = self._pass(features[:-1], tokens, features, 1, mask, generator)
            loss = regression + self.ce_weight * ce
            if self.unroll == 2 and n > 3:
                mask2 = (torch.arange(n - 2) + 3 >= prompt_len) & (torch.arange(n - 2) + 3 < n)
                _, reg2, ce2, _ = self._pass(pred[:-1], tokens, features, 2, mask2, generator)
                loss = (loss + reg2 + self.ce_weight * ce2) / 2
            total = total + loss / self.batch_size
            stats["reg"] += float(regression.detach()) / self.batch_size
            stats["agree"] += float(agree) / self.batch_size
        return total, stats

    @staticmethod
    def _first_pass_rows(n: int, prompt_len: int) -> torch.Tensor:
        """Pass 1, row t predicts f_{t+1}: scored where x_{t+2} is a response token and exists [n - 1]."""
        return (torch.arange(n - 1) + 2 >= prompt_len) & (torch.arange(n - 1) + 2 < n)

    def validate(self) -> float | None:
        """Held-out first-draft top-1 agreement: argmax of lm_head(pass-1 prediction from the true
        f_t, no noise) vs argmax of lm_head(f_{t+1}), over the validation sequences' response rows
        (each cut to its last max_len tokens, as in training). None without validation data."""
        if self.validation is None:
            return None
        agree, rows = 0, 0
        with torch.no_grad():
            for i in range(len(self.validation)):
                tokens, features, prompt_len = cut_sequence(self.validation, i, self.max_len)
                mask = self._first_pass_rows(tokens.numel(), prompt_len)
                if not mask.any():
                    continue
                pred = self._predict(features[:-1], tokens, 1)[mask]  # [r, hidden]
                agree += int(
                    (self.space.logits(pred).argmax(-1) == self.space.logits(features[1:][mask]).argmax(-1)).sum()
                )
                rows += int(mask.sum())
        return agree / max(1, rows)
