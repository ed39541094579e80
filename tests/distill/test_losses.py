"""Each distillation loss against numbers worked out by hand on 2-token vocabularies.

Teacher logits [0, 0] give p = [1/2, 1/2]; student logits [ln 3, 0] give q = [3/4, 1/4]:
  KL(p||q) = 1/2 ln(4/3)                          = 0.1438410362
  KL(q||p) = 3/4 ln(3/2) + 1/4 ln(1/2)            = 0.1308120360
  M = p/2 + q/2 = [5/8, 3/8]
  KL(p||M) = 1/2 ln(4/5) + 1/2 ln(4/3)            = 0.0322692564
  KL(q||M) = 3/4 ln(6/5) + 1/4 ln(2/3)            = 0.0353748890
  JSD(1/2) = (0.0322692564 + 0.0353748890) / 2    = 0.0338220727
  CE(q, label 0) = -ln(3/4)                       = 0.2876820725
"""

import math

import pytest
import torch

from speclm.distill.losses import (
    FeatureDistillation,
    distillation_loss,
    forward_kl,
    generalized_jsd,
    hard_ce,
    layer_map,
    reverse_kl,
)

P = torch.tensor([[0.0, 0.0]])
Q = torch.tensor([[math.log(3.0), 0.0]])


def test_forward_and_reverse_kl():
    assert forward_kl(Q, P).item() == pytest.approx(0.1438410362, abs=1e-7)
    assert reverse_kl(Q, P).item() == pytest.approx(0.1308120360, abs=1e-7)


def test_temperature_softens_and_scales_by_t_squared():
    # at T = 2 the student logits [2 ln 3, 0] soften to q = [3/4, 1/4] again: 4 * 0.1438410362
    assert forward_kl(torch.tensor([[2 * math.log(3.0), 0.0]]), P, temperature=2.0).item() == pytest.approx(
        0.5753641449, abs=1e-6
    )


def test_generalized_jsd_and_its_limits():
    assert generalized_jsd(Q, P, beta=0.5).item() == pytest.approx(0.0338220727, abs=1e-7)
    assert generalized_jsd(Q, P, beta=0.0).item() == pytest.approx(0.1438410362, abs=1e-7)
    assert generalized_jsd(Q, P, beta=1.0).item() == pytest.approx(0.1308120360, abs=1e-7)
    # the beta = 0 / 1 values are the limits of JSD/beta and JSD/(1-beta)
    assert generalized_jsd(Q, P, beta=1e-4).item() / 1e-4 == pytest.approx(0.1438410362, rel=5e-3)
    assert generalized_jsd(Q, P, beta=1 - 1e-4).item() / 1e-4 == pytest.approx(0.1308120360, rel=5e-3)
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(Q, P, beta=1.5)


def test_hard_ce_and_alpha_mix():
    label = torch.tensor([0])
    assert hard_ce(Q, label).item() == pytest.approx(0.2876820725, abs=1e-7)
    mixed = distillation_loss(Q, P, label, divergence="fkl", alpha=0.5)
    assert mixed.item() == pytest.approx(0.5 * 0.1438410362 + 0.5 * 0.2876820725, abs=1e-7)
    assert distillation_loss(Q, P, divergence="rkl").item() == pytest.approx(0.1308120360, abs=1e-7)
    with pytest.raises(ValueError, match="divergence"):
        distillation_loss(Q, P, divergence="tvd")
    with pytest.raises(ValueError, match="hard labels"):
        distillation_loss(Q, P, alpha=0.5)


def test_mask_averages_only_kept_positions():
    student = torch.tensor([[math.log(3.0), 0.0], [5.0, -5.0]])  # the second row is far off but masked
    teacher = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    assert forward_kl(student, teacher, mask=torch.tensor([True, False])).item() == pytest.approx(
        0.1438410362, abs=1e-7
    )
    equal = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # second row: KL 0, so the unmasked mean halves
    assert forward_kl(equal, teacher).item() == pytest.approx(0.1438410362 / 2, abs=1e-7)


def test_layer_maps():
    assert layer_map(2, 30, "uniform") == [14, 29]
    assert layer_map(3, 30, "uniform") == [9, 19, 29]
    assert layer_map(2, 30, "last") == [28, 29]
    with pytest.raises(ValueError, match="style"):
        layer_map(2, 30, "skip")


def test_feature_loss_hand_values():
    student = [torch.tensor([[1.0, 2.0]])]
    teacher = [torch.tensor([[9.0, 9.0]]), torch.tensor([[1.0, 0.0]])]
    plain = FeatureDistillation(2, 2, [0], [1])  # identity projection at init: ((1-1)^2 + (2-0)^2) / 2 = 2
    assert plain(student, teacher).item() == pytest.approx(2.0, abs=1e-7)
    # unit vectors [1,2]/sqrt5 vs [1,0]: ((1 - 1/sqrt5)^2 + 4/5) / 2 = 1 - 1/sqrt5 = 0.5527864045
    normalized = FeatureDistillation(2, 2, [0], [1], normalize=True)
    assert normalized(student, teacher).item() == pytest.approx(0.5527864045, abs=1e-7)
    # the projection is learned: one gradient step lowers the loss
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    before = plain(student, teacher)
    before.backward()
    opt.step()
    assert plain(student, teacher).item() < before.item()
