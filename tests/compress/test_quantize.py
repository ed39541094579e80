"""RTN error bounds, storage round trips, and GPTQ/AWQ/SmoothQuant against their defining properties."""

import pytest
import torch

from speclm.compress.awq import awq_scale_layer, output_mse
from speclm.compress.calibration import hessian
from speclm.compress.gptq import gptq
from speclm.compress.qformat import fp8_quantize
from speclm.compress.rtn import QuantScheme, expand, rtn
from speclm.compress.smoothquant import fake_quantize_per_token, smooth_layer, smooth_scale
from speclm.models.attention import AttentionMetadata
from speclm.models.config import ModelConfig
from speclm.models.layers import DecoderLayer
from speclm.models.qformat import pack, unpack
from speclm.models.rope import RotaryEmbedding


@pytest.mark.parametrize("bits,group,sym", [(8, 0, True), (4, 0, False), (4, 32, False), (4, 32, True), (3, 16, False)])
def test_rtn_round_trip_error_is_at_most_half_a_step(bits, group, sym):
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(bits + group)) * 0.05
    qw = rtn(w, QuantScheme(bits, group, sym))
    assert qw.q.dtype == torch.uint8 and int(qw.q.max()) <= 2**bits - 1
    assert qw.scale.shape == (48, 1 if group == 0 else 96 // group)
    err = (qw.dequantize() - w).abs()
    step = expand(qw.scale, 96, qw.scheme)
    assert bool((err <= step / 2 + 1e-6).all())
    # and the step is what the range implies: (max - min) / (2^b - 1) asymmetric, absmax / (2^(b-1) - 1) symmetric
    g = w[:, : (group or 96)]
    expected = (
        g.abs().amax(1) / (2 ** (bits - 1) - 1)
        if sym
        else (g.amax(1).clamp(min=0) - g.amin(1).clamp(max=0)) / (2**bits - 1)
    )
    torch.testing.assert_close(qw.scale[:, 0], expected)


def test_int8_relative_error_is_small_and_int4_is_larger():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    e8 = (rtn(w, QuantScheme(8)).dequantize() - w).norm() / w.norm()
    e4 = (rtn(w, QuantScheme(4, 32, False)).dequantize() - w).norm() / w.norm()
    assert e8 < 0.01 < e4 < 0.15


def test_int4_packing_round_trips():
    q = torch.randint(0, 16, (5, 12), dtype=torch.uint8)
    packed = pack(q, 4)
    assert packed.shape == (5, 6)
    assert torch.equal(unpack(packed, 4, 12), q)


@pytest.mark.parametrize("fmt,max_rel", [("e4m3", 0.07), ("e5m2", 0.13)])
def test_fp8_round_trip_relative_error(fmt, max_rel):
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    w8, scale = fp8_quantize(w, fmt)
    rel = ((w8.float() * scale - w).abs() / w.abs().clamp(min=1e-2)).max()
    assert rel < max_rel  # 3 (e4m3) / 2 (e5m2) mantissa bits: relative step 2^-4 / 2^-3


def correlated_inputs(n=2048, cin=128, rank=16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, rank, generator=g) @ torch.randn(rank, cin, generator=g) + 0.1 * torch.randn(
        n, cin, generator=g
    )


@pytest.mark.parametrize(
    "scheme,act_order",
    [
        (QuantScheme(4, 0, True), False),
        (QuantScheme(4, 32, False), False),
        (QuantScheme(4, 32, False), True),
        (QuantScheme(3, 32, False), False),
    ],
)
def test_gptq_beats_rtn_on_layer_reconstruction_with_correlated_inputs(scheme, act_order):
    x = correlated_inputs()
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(2))
    qw = gptq(w, hessian(x), scheme, act_order=act_order)
    err_gptq = (x @ (w - qw.dequantize()).T).pow(2).mean()
    err_rtn = (x @ (w - rtn(w, scheme).dequantize()).T).pow(2).mean()
    assert err_gptq < 0.5 * err_rtn, (err_gptq, err_rtn)
    # GPTQ's output lies exactly on its stored grid
    assert qw.q.dtype == torch.uint8 and int(qw.q.max()) <= scheme.maxq


def gptq_reference(w: torch.Tensor, h: torch.Tensor, scheme: QuantScheme, percdamp: float = 0.01) -> torch.Tensor:
    """The unblocked algorithm straight from the paper's derivation (OBS with a fixed order): quantize
    column j, spread its error over the later columns through the current inverse Hessian, then remove
    j from that inverse (Schur complement). No Cholesky, no lazy batches: what gptq() must reproduce."""
    from speclm.compress.rtn import find_params, quantize_column

    w = w.double().clone()
    h = h.double() + percdamp * torch.diag(h).double().mean() * torch.eye(h.shape[0], dtype=torch.float64)
    h_inv = torch.linalg.inv(h)
    width = scheme.group_width(w.shape[1])
    for j in range(w.shape[1]):
        if j % width == 0:  # group params from the group's weights as updated so far
            scale, zero = (t.double() for t in find_params(w[:, j : j + width].float(), scheme))
        q = quantize_column(w[:, j], scale, zero, scheme.maxq)
        err = (w[:, j] - q) / h_inv[j, j]
        w[:, j:] -= err.unsqueeze(1) * h_inv[j, j:].unsqueeze(0)
        w[:, j] = q
        h_inv = h_inv - torch.outer(h_inv[:, j], h_inv[j, :]) / h_inv[j, j]
    return w.float()


@pytest.mark.parametrize("block_size", [8, 32, 128])
@pytest.mark.parametrize("scheme", [QuantScheme(4, 0, True), QuantScheme(4, 16, False), QuantScheme(3, 32, False)])
def test_gptq_lazy_batches_equal_the_unblocked_reference(scheme, block_size):
    """Blocking, the Cholesky form of H^-1 and per-group params must not change a single weight
    (up to fp32 ties at rounding boundaries)."""
    x = correlated_inputs(n=512, cin=64)
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(3))
    h = hessian(x)
    ours = gptq(w, h, scheme, block_size=block_size).dequantize()
    reference = gptq_reference(w, h, scheme)
    same = torch.isclose(ours, reference, atol=1e-4)
    assert same.float().mean() > 0.995, same.float().mean()


def signed_max_fit(w: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q4_0's rule: the weight of largest magnitude / -2^(bits-1), so it lands on a code exactly."""
    half = 2 ** (scheme.bits - 1)
    big = torch.gather(w, 1, w.abs().argmax(dim=1, keepdim=True)).squeeze(1)
    return big / -half, torch.full_like(big, float(half))


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_uses_the_given_group_fit(act_order):
    """With a diagonal Hessian no error spreads, so GPTQ is round-to-nearest on the grid its `fit` chose."""
    scheme = QuantScheme(3, 16, True)
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(5))
    h = torch.diag(torch.rand(64, generator=torch.Generator().manual_seed(6)) + 0.5)
    qw = gptq(w, h, scheme, act_order=act_order, fit=signed_max_fit)
    scale = torch.stack([signed_max_fit(w[:, g : g + 16], scheme)[0] for g in range(0, 64, 16)], dim=1)
    torch.testing.assert_close(qw.scale, scale)
    s = expand(scale, 64, scheme)
    torch.testing.assert_close(qw.dequantize(), (torch.clamp(torch.round(w / s) + 4, 0, 7) - 4) * s)
    # all 8 levels are used (step absmax / 4), not the default fit's 7 (absmax / 3)
    assert int(qw.q.min()) == 0 and int(qw.q.max()) == 7
    default = gptq(w, h, scheme, act_order=act_order).dequantize()
    assert not torch.allclose(default, qw.dequantize())


def test_awq_loss_from_the_gram_matrix_equals_the_direct_output_error():
    x = correlated_inputs(n=300, cin=48)
    delta = torch.randn(20, 48, generator=torch.Generator().manual_seed(4)) * 0.01
    direct = (x @ delta.T).pow(2).mean().item()
    assert output_mse(delta, x.T @ x, x.shape[0]) == pytest.approx(direct, rel=1e-4)


def tiny_layer(num_kv_heads: int) -> tuple[ModelConfig, DecoderLayer]:
    config = ModelConfig(
        "llama",
        vocab_size=32,
        hidden_size=64,
        intermediate_size=96,
        num_layers=1,
        num_heads=4,
        num_kv_heads=num_kv_heads,
    )
    torch.manual_seed(0)
    layer = DecoderLayer(config)
    with torch.no_grad():
        layer.input_layernorm.weight.uniform_(0.5, 1.5)
        layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return config, layer


def run_layer(config, layer, x):
    cos, sin = RotaryEmbedding(config)(torch.arange(x.shape[0]))
    k = torch.zeros(config.num_kv_heads, x.shape[0], config.head_dim)
    v = torch.zeros_like(k)
    with torch.no_grad():
        return layer(x, cos, sin, k, v, AttentionMetadata(0, x.shape[0]))


def capture(layer, config, x):
    captured = {}
    handles = [
        layer.get_submodule(n).register_forward_pre_hook(lambda _m, a, n=n: captured.__setitem__(n, a[0].clone()))
        for n in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    ]
    run_layer(config, layer, x)
    for h in handles:
        h.remove()
    return captured


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_awq_and_smoothquant_scale_folding_leaves_the_fp32_layer_unchanged(num_kv_heads):
    config, layer = tiny_layer(num_kv_heads)
    x = torch.randn(24, 64) * torch.linspace(0.1, 8, 64)  # outlier channels
    before = run_layer(config, layer, x)
    inputs = capture(layer, config, x)
    awq_scale_layer(layer, inputs, QuantScheme(4, 32, False))
    torch.testing.assert_close(run_layer(config, layer, x), before, rtol=1e-4, atol=1e-4)
    smooth_layer(layer, capture(layer, config, x), alpha=0.5)
    torch.testing.assert_close(run_layer(config, layer, x), before, rtol=1e-4, atol=1e-4)


def test_smoothquant_reduces_w8a8_error_with_an_outlier_channel():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g)
    x[:, 3] *= 40  # one outlier channel, as in LLM activations
    w = torch.randn(96, 64, generator=g) * 0.05
    ref = x @ w.T

    def w8a8_error(xs, ws):
        return (fake_quantize_per_token(xs, 8) @ rtn(ws, QuantScheme(8)).dequantize().T - ref).pow(2).mean()

    s = smooth_scale(x.abs().amax(dim=0), w, alpha=0.5)
    assert w8a8_error(x / s, w * s) < 0.5 * w8a8_error(x, w)
