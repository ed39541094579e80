"""The w8a8 head of int4 models: batch invariance (what keeps speculative greedy exact), accuracy
against the float product, the token-subset head, and that users cannot pick it as a model format;
on speclm's VNNI kernel where it was built and on fbgemm (the fallback)."""

import pytest
import torch

from speclm.config import WeightFormat
from speclm.models import w8a8_linear
from speclm.models.w8a8_linear import W8A8Linear, w8a8_supported
from speclm.models.weight_formats import head_format

pytestmark = [
    pytest.mark.skipif(not w8a8_supported(), reason="torch build without fbgemm"),
    pytest.mark.parametrize("backend", ["speclm", "fbgemm"], indirect=True),
]


@pytest.fixture
def backend(request, monkeypatch):
    if request.param == "fbgemm":
        monkeypatch.setattr(w8a8_linear, "w8a8_kernels", lambda weight: None)
    elif w8a8_linear.w8a8_kernels(torch.zeros(16, 64)) is None:
        pytest.skip("speclm's w8a8 kernel needs AVX-512 VNNI")
    return request.param


def make_layer(out_features=300, in_features=64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    return W8A8Linear(w, b), w, b


def test_rows_do_not_depend_on_the_batch(backend):
    layer, _, _ = make_layer()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1)) * torch.logspace(-2, 2, 7)[:, None]
    together = layer(x)
    for i in range(7):
        assert torch.equal(together[i], layer(x[i : i + 1])[0]), i
    assert torch.equal(layer(x[2:5]), together[2:5])  # a middle slice, after the buffer grew


def test_close_to_the_float_product(backend):
    layer, w, b = make_layer()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    ref = x @ w.t() + b
    rel = (layer(x) - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    assert rel.max() < 0.02, rel  # 8-bit weights and activations: ~1% of the output range
    # Half a step of the stored scale, plus what the clamp at +-127 cuts when that scale (rounded to
    # bf16 by quantize_int8) is a little below absmax / 127.
    if backend == "fbgemm":
        scales = torch.ops.quantized.linear_unpack(layer.packed)[0].q_per_channel_scales().float()
    else:
        assert layer.on_kernel
        scales = layer.weight_scales[:300]
    absmax = w.abs().amax(dim=1)
    bound = torch.maximum(scales / 2, absmax - 127 * scales) + 1e-6
    assert ((layer.dequantized_weight() - w).abs().amax(dim=1) <= bound).all()


def test_bf16_input_and_zero_row(backend):
    layer, w, b = make_layer(bias=False)
    x = torch.zeros(2, 64)
    x[1] = torch.randn(64)
    y = layer(x.bfloat16())
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    assert torch.equal(y[0], torch.zeros(300))


def test_token_subset_head_equals_its_columns(backend, monkeypatch):
    layer, _, _ = make_layer()
    index = torch.tensor([3, 7, 100, 299, 16, 15])  # (the kernel's blocks hold 16 rows)
    x = torch.randn(3, 64)

    def whole(*args):  # a draft head adds context rows as tokens appear: cutting must not unpack it all
        raise AssertionError("rows() dequantized the whole head")

    monkeypatch.setattr(layer, "dequantized_weight", whole)
    expected = layer(x)[:, index]
    assert torch.equal(layer.rows(index)(x), expected)
    if backend == "fbgemm":  # fbgemm's packed weight is unpacked once, not at every cut
        layer.packed = None
        assert torch.equal(layer.rows(index)(x), expected)


def test_int4_models_get_a_w8a8_head_but_users_cannot_choose_it(backend):
    assert head_format(WeightFormat.parse("int4")).name == "w8a8"
    assert head_format(WeightFormat.parse("int8")).name == "int8"
    with pytest.raises(ValueError, match="unknown weight format 'w8a8'"):
        WeightFormat.parse("w8a8")
