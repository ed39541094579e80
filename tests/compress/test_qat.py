"""QAT: gradients flow through the straight-through estimator and the quantized result fits the data better."""

import torch

from speclm.compress.data import calibration_windows, read_texts, tokenize_stream
from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.compress.ppl import perplexity
from speclm.compress.qat import StraightThroughQuant
from speclm.compress.quantize import QuantizeOptions, quantize_model
from speclm.compress.rtn import QuantScheme, rtn
from tests.conftest import SPECBENCH, STORIES_MODEL, STORIES_TOKENIZER


def test_straight_through_estimator_forward_quantizes_backward_is_identity():
    w = torch.randn(4, 8, requires_grad=True)
    ste = StraightThroughQuant(QuantScheme(4))
    out = ste(w)
    assert torch.equal(out.detach(), rtn(w.detach(), QuantScheme(4)).dequantize())
    (out * torch.arange(32.0).view(4, 8)).sum().backward()
    assert torch.equal(w.grad, torch.arange(32.0).view(4, 8))


def test_qat_int4_fits_its_training_text_better_than_rtn_int4():
    checkpoint, tokenizer = load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)
    windows = calibration_windows(tokenize_stream(tokenizer, read_texts(SPECBENCH, ["qa"])), 4, 64, seed=0)
    rtn_model = quantize_model(rebuild(checkpoint), QuantizeOptions("rtn-int4", group_size=0, sym=True)).model
    options = QuantizeOptions("qat-int4", group_size=0, sym=True, qat_steps=8, qat_lr=1e-3)
    result = quantize_model(rebuild(checkpoint), options, windows)
    assert result.quantization_config["qat_steps"] == 8
    # the stored weights are on the int4 grid: re-quantizing changes nothing
    w = result.model.layers[0].mlp.down_proj.weight
    torch.testing.assert_close(rtn(w, options.scheme()).dequantize(), w)
    before = perplexity(rtn_model, windows, progress=False).perplexity
    after = perplexity(result.model, windows, progress=False).perplexity
    assert after < 0.8 * before, (after, before)
