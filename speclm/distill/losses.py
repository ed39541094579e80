"""Distillation losses: temperature KD (forward KL + hard CE), reverse KL, generalized JSD, features."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of per-position `values` [...] over the positions where `mask` [...] is true (all if None)."""
    if mask is None:
        return values.mean()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be positive, got {temperature}")
    return F.log_softmax(logits.float() / temperature, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position over the last axis; 0 * log 0 counts as 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def forward_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """T^2 * KL(p_teacher^T || q_student^T), the mean over masked positions. The T^2 keeps the
    gradient's scale independent of T (Hinton et al. 2015). Logits are [..., vocab]."""
    kl = _kl(_log_probs(teacher_logits, temperature), _log_probs(student_logits, temperature))
    return temperature**2 * masked_mean(kl, mask)


def reverse_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """T^2 * KL(q_student^T || p_teacher^T), the mode-seeking direction MiniLLM trains with."""
    kl = _kl(_log_probs(student_logits, temperature), _log_probs(teacher_logits, temperature))
    return temperature**2 * masked_mean(kl, mask)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """GKD's JSD(beta) = beta KL(P || M) + (1-beta) KL(Q || M), M = beta P + (1-beta) Q, with P the
    teacher and Q the student (times T^2). JSD(beta) vanishes at beta = 0 and 1, but JSD/beta tends
    to the forward KL(P || Q) as beta -> 0 and JSD/(1-beta) to the reverse KL(Q || P) as beta -> 1;
    those limits are what beta = 0 and beta = 1 compute (GKD's convention)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"JSD beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student_logits, teacher_logits, temperature, mask)
    if beta == 1.0:
        return reverse_kl(student_logits, teacher_logits, temperature, mask)
    log_p = _log_probs(teacher_logits, temperature)
    log_q = _log_probs(student_logits, temperature)
    log_m = torch.logsumexp(torch.stack([log_p + math.log(beta), log_q + math.log(1.0 - beta)]), dim=0)
    jsd = beta * _kl(log_p, log_m) + (1.0 - beta) * _kl(log_q, log_m)
    return temperature**2 * masked_mean(jsd, mask)


def hard_ce(student_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy against hard labels [...] (temperature 1), the mean over masked positions."""
    ce = F.cross_entropy(student_logits.float().flatten(0, -2), labels.flatten(), reduction="none")
    return masked_mean(ce.view(labels.shape), mask)


DIVERGENCES = ("fkl", "rkl", "jsd")


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    divergence: str = "fkl",
    alpha: float = 0.0,
    temperature: float = 1.0,
    beta: float = 0.5,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(1 - alpha) * divergence(teacher, student at temperature T, times T^2) + alpha * hard CE(labels).
    divergence: fkl (forward KL), rkl (reverse KL) or jsd (generalized JSD with beta)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (hard-label weight) must be in [0, 1], got {alpha}")
    if divergence == "fkl":
        soft = forward_kl(student_logits, teacher_logits, temperature, mask)
    elif divergence == "rkl":
        soft = reverse_kl(student_logits, teacher_logits, temperature, mask)
    elif divergence == "jsd":
        soft = generalized_jsd(student_logits, teacher_logits, beta, temperature, mask)
    else:
        raise ValueError(f"unknown divergence {divergence!r} (expected one of {', '.join(DIVERGENCES)})")
    if alpha == 0.0:
        return soft
    if labels is None:
        raise ValueError("alpha > 0 needs hard labels")
    return (1.0 - alpha) * soft + alpha * hard_ce(student_logits, labels, mask)


def layer_map(num_student: int, num_teacher: int, style: str = "uniform") -> list[int]:
    """For each student layer (0-based) the teacher layer it learns from (0-based).
    uniform: student layer i <- teacher layer (i+1)*T/S - 1, spread evenly, last to last (DistilBERT/
    TinyBERT style); last: the top S teacher layers (patient KD's PKD-Last)."""
    if num_student < 1 or num_teacher < num_student:
        raise ValueError(f"layer map needs 1 <= student layers <= teacher layers, got {num_student}, {num_teacher}")
    if style == "uniform":
        return [(i + 1) * num_teacher // num_student - 1 for i in range(num_student)]
    if style == "last":
        return list(range(num_teacher - num_student, num_teacher))
    raise ValueError(f"unknown layer-map style {style!r} (expected uniform or last)")


class FeatureDistillation(nn.Module):
    """Hidden-state distillation: a learned linear projection per student layer maps its hidden state
    to the teacher's width; the loss is the mean squared error to the mapped teacher layer's hidden
    state (PKD normalizes both to unit length first: normalize=True), averaged over layers and
    masked positions."""

    def __init__(
        self,
        student_hidden: int,
        teacher_hidden: int,
        student_layers: list[int],
        teacher_layers: list[int],
        normalize: bool = False,
    ) -> None:
        super().__init__()
        if len(student_layers) != len(teacher_layers):
            raise ValueError(f"layer map pairs {len(student_layers)} student with {len(teacher_layers)} teacher layers")
        self.student_layers, self.teacher_layers = list(student_layers), list(teacher_layers)
        self.normalize = normalize
        self.projections = nn.ModuleList(
            nn.Linear(student_hidden, teacher_hidden, bias=False) for _ in self.student_layers
        )
        if student_hidden == teacher_hidden:  # start at the identity: same-width students begin unprojected
            for p in self.projections:
                nn.init.eye_(p.weight)

    def forward(
        self, student_hidden: list[torch.Tensor], teacher_hidden: list[torch.Tensor], mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """student_hidden / teacher_hidden: per-layer [..., width] states, indexed by layer."""
        losses = []
        for proj, s, t in zip(self.projections, self.student_layers, self.teacher_layers):
            x, y = proj(student_hidden[s].float()), teacher_hidden[t].float()
            if self.normalize:
                x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
            losses.append(masked_mean((x - y).pow(2).mean(-1), mask))
        return torch.stack(losses).mean()
