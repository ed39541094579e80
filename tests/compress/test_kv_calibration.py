"""int8 KV-cache calibration: scales match the cache contents and the int8 round trip is accurate."""

import json

import torch

from speclm.compress.data import calibration_windows, read_texts, tokenize_stream
from speclm.compress.kv_calibration import calibrate_kv_scales, fake_quantize_kv
from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.models.attention import AttentionMetadata
from tests.compress.conftest import stories_command
from tests.conftest import SPECBENCH, STORIES_MODEL, STORIES_TOKENIZER


def test_kv_scales_are_the_cache_absmax_and_int8_round_trip_is_close(tmp_path):
    checkpoint, tokenizer = load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)
    stream = tokenize_stream(tokenizer, read_texts(SPECBENCH, ["qa"]))
    windows = calibration_windows(stream, 3, 64, seed=0)
    model = rebuild(checkpoint)
    scales = calibrate_kv_scales(model, windows)
    c = model.config
    assert scales.shape == (c.num_layers, 2, c.num_kv_heads)
    absmax = torch.zeros(c.num_layers, 2, c.num_kv_heads)
    for w in windows:  # the whole model in one pass, reading its real cache
        cache = model.new_cache(64)
        model(w, torch.arange(64), cache, AttentionMetadata(0, 64))
        absmax[:, 0] = torch.maximum(absmax[:, 0], cache.keys.abs().amax(dim=(2, 3)))
        absmax[:, 1] = torch.maximum(absmax[:, 1], cache.values.abs().amax(dim=(2, 3)))
    torch.testing.assert_close(scales, absmax / 127)
    keys = cache.keys[0]
    rel = (fake_quantize_kv(keys, scales[0, 0]) - keys).norm() / keys.norm()
    assert rel < 0.02
    out = str(tmp_path / "q")
    calibration = [
        "--calib-text",
        SPECBENCH,
        "--calib-categories",
        "qa",
        "--calib-samples",
        "2",
        "--calib-seq-len",
        "64",
    ]
    assert stories_command("quantize", "--method", "rtn-int8", "--kv-cache-int8", "--out", out, *calibration) == 0
    config = json.load(open(f"{out}/config.json"))["quantization_config"]
    assert config["kv_cache"]["dtype"] == "int8"
    from speclm.models.loader import load_checkpoint

    assert load_checkpoint(out).tensors["model.layers.4.self_attn.v_scale"].shape == (c.num_kv_heads,)
