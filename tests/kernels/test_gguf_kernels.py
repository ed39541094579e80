"""GGUF-native weights: every supported tensor type runs on its own grid. The repacked weights
dequantize to exactly what the gguf package decodes from the file, the matmul equals an fp64 product
with the same int8-quantized activations (llama.cpp's scheme) to float rounding, and a row's result
does not depend on the other rows."""

import gguf
import numpy as np
import pytest
import torch

from speclm.models.gguf_weights import NATIVE_TYPES, NO_ORDER, GGUFLinear, PackArena, Segment, native_kernels

T = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(native_kernels() is None, reason="no GGUF-native kernels here (AVX-512 VNNI or AVX2)")


def raw_tensor(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """[rows, row_bytes] of one type: quantized by gguf where it can, else random blocks with sane scales."""
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05, T[kind])
    block_weights, block_bytes = gguf.GGML_QUANT_SIZES[T[kind]]
    blocks = rng.integers(0, 256, (rows, cols // block_weights, block_bytes), dtype=np.uint8)
    scales = rng.uniform(1e-3, 2e-2, (rows, cols // block_weights, 2)).astype(np.float16).view(np.uint8)
    if kind == "Q6_K":
        blocks[..., 208:210] = scales[..., :2]
    else:  # d then dmin lead the block
        blocks[..., 0:4] = scales
    return blocks.reshape(rows, -1)


def reference_quantization(x: np.ndarray, k_quant: bool) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's activation quantization, scalar: per 32 (Q8_0, fp16 scale) or per 256 (Q8_K).
    Returns the codes [M, K] and the block scales [M, K / block]."""
    block = 256 if k_quant else 32
    codes, scales = np.empty(x.shape, np.float32), np.empty((x.shape[0], x.shape[1] // block), np.float32)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // block):
            v = x[r, b * block : (b + 1) * block]
            if k_quant:
                big = v[np.argmax(np.abs(v))]  # the first of largest magnitude, with its sign
                if big == 0:
                    q, d = np.zeros_like(v), np.float32(0)
                else:
                    scale = np.float32(-127.0) / big
                    q, d = np.minimum(127, np.rint(scale * v)), np.float32(1.0) / scale
            else:
                d = np.float32(np.abs(v).max() / np.float32(127))
                inverse = np.float32(1) / d if d != 0 else np.float32(0)
                q, d = np.rint(v * inverse), np.float32(np.float16(d))
            codes[r, b * block : (b + 1) * block], scales[r, b] = q, d
    return codes, scales


def quantized_activations(x: np.ndarray, k_quant: bool) -> np.ndarray:
    """What the kernel multiplies: each row's codes times their block's scale."""
    codes, scales = reference_quantization(x, k_quant)
    return codes * np.repeat(scales, 256 if k_quant else 32, axis=1)


@pytest.mark.parametrize("k_quant", [False, True])
def test_activations_are_quantized_as_llama_cpp_quantizes_them(k_quant):
    """The vectorized quantizer gives the scalar reference's codes, scales and sums bit for bit, also on
    the edge cases: codes exactly halfway (rounded to even), a block of zeros, and +a and -a both of
    largest magnitude (Q8_K takes the first one's sign)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 1024)).astype(np.float32) * rng.uniform(0.01, 30, (6, 1)).astype(np.float32)
    x[1, :256] = 0.0  # a zero block
    x[2, :256] = np.arange(256, dtype=np.float32) - 127.5  # halves everywhere
    x[2, 256:512] = (np.arange(256, dtype=np.float32) % 8 - 3.5) / 2  # more halves
    x[3, 10], x[3, 20] = 5.0, -5.0  # a tie in magnitude: + first
    x[3, 300], x[3, 310] = -7.0, 7.0  # - first
    x[4, 32:64] = 1e-30  # tiny values
    codes, scales, sums = native_kernels().gguf_quantize_activations(torch.from_numpy(x), k_quant)
    want_codes, want_scales = reference_quantization(x, k_quant)
    assert np.array_equal(codes.numpy(), want_codes.astype(np.int8))
    assert np.array_equal(scales.numpy(), want_scales)
    group = 16 if k_quant else 32
    assert np.array_equal(sums.numpy(), want_codes.reshape(6, -1, group).sum(axis=2).astype(np.int32))
    assert (codes[2] != 0).any() and (codes.abs() == 127).any()  # the case is not vacuous


@pytest.mark.parametrize("kind", list(NATIVE_TYPES))
def test_native_type_equals_the_gguf_package_and_is_row_invariant(kind):
    rng = np.random.default_rng(NATIVE_TYPES[kind])
    rows, cols = 37, 512  # an output count that is not a multiple of 16
    raw = raw_tensor(kind, rows, cols, rng)
    reference = gguf.quants.dequantize(raw, T[kind]).reshape(rows, cols)
    layer = GGUFLinear([Segment.from_raw(kind, torch.from_numpy(np.ascontiguousarray(raw)))], cols)
    assert np.array_equal(layer.dequantized_weight().numpy(), reference)
    x = torch.randn(9, cols, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    exact = quantized_activations(x.numpy(), kind.endswith("_K")).astype(np.float64) @ reference.astype(np.float64).T
    np.testing.assert_allclose(y.numpy(), exact, rtol=2e-6, atol=2e-6 * np.abs(exact).max())
    alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
    assert torch.equal(y, alone)
    before = torch.get_num_threads()
    try:  # nor does the number of threads splitting the output blocks change a bit
        torch.set_num_threads(1)
        one_thread = layer(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y, one_thread)


SCALE_BYTES = {"Q4_0": (0, 2), "Q5_0": (0, 2), "Q8_0": (0, 2), "Q6_K": (208, 210)}  # fp16 fields; others 0:4


@pytest.mark.parametrize("kind", list(NATIVE_TYPES))
def test_largest_codes_times_largest_activations(kind):
    """Every code at its type's largest value (Q8_0: -128) against activations of +-127 everywhere: the
    kernels' integer sums (16-bit partial sums on AVX2) must not overflow, whatever rows share a pass."""
    rng = np.random.default_rng(NATIVE_TYPES[kind] + 100)
    raw = raw_tensor(kind, 32, 512, rng).reshape(32, -1, gguf.GGML_QUANT_SIZES[T[kind]][1])
    first, end = SCALE_BYTES.get(kind, (0, 4))
    keep = raw[..., first:end].copy()
    raw[...] = 0x80 if kind == "Q8_0" else 0xFF
    raw[..., first:end] = keep
    raw = np.ascontiguousarray(raw.reshape(32, -1))
    reference = gguf.quants.dequantize(raw, T[kind]).reshape(32, 512)
    layer = GGUFLinear([Segment.from_raw(kind, torch.from_numpy(raw))], 512)
    x = torch.ones(6, 512)
    x[1], x[2, ::2], x[3, 1::2] = -1.0, -1.0, -1.0  # +127 everywhere, -127, alternating, and random rows
    x[4:] = torch.randn(2, 512, generator=torch.Generator().manual_seed(4))
    exact = quantized_activations(x.numpy(), kind.endswith("_K")).astype(np.float64) @ reference.astype(np.float64).T
    np.testing.assert_allclose(layer(x).numpy(), exact, rtol=2e-6, atol=2e-6 * np.abs(exact).max())


def test_rows_sharing_a_pass_change_no_result():
    """How many activation rows gguf_matmul multiplies in one pass over the weights is a speed setting:
    every number gives the same bits, and a number outside 1-6 is refused."""
    kernels = native_kernels()
    rng = np.random.default_rng(8)
    layers = [
        GGUFLinear([Segment.from_raw(k, torch.from_numpy(raw_tensor(k, 40, 512, rng)))], 512) for k in NATIVE_TYPES
    ]
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(5))  # groups and a remainder
    previous = kernels.gguf_set_row_group(1)
    try:
        one_by_one = [layer(x) for layer in layers]
        for rows in range(2, 7):
            kernels.gguf_set_row_group(rows)
            for layer, want in zip(layers, one_by_one, strict=True):
                assert torch.equal(layer(x), want)
        with pytest.raises(RuntimeError, match="1 to 6"):
            kernels.gguf_set_row_group(7)
    finally:
        kernels.gguf_set_row_group(previous)


def test_tensors_packed_into_an_arena_equal_a_buffer_of_their_own():
    """A loader's PackArena hands out views of shared buffers (dirty memory, rows not a multiple of 16,
    tensors spilling into a new buffer): the bytes equal a fresh buffer's and no tensor overwrites another."""
    rng = np.random.default_rng(3)
    raws = [torch.from_numpy(np.ascontiguousarray(raw_tensor(k, 37, 512, rng))) for k in ("Q4_K", "Q6_K", "Q8_0") * 2]
    arena = PackArena()
    arena.BUFFER_BYTES = 40_000  # (a few tensors per buffer)
    arena.take(arena.BUFFER_BYTES).fill_(0xAB)  # what a buffer held before does not leak into padding outputs
    arena.used = 0
    kinds = ("Q4_K", "Q6_K", "Q8_0") * 2
    shared = [Segment.from_raw(k, raw, arena=arena) for k, raw in zip(kinds, raws)]
    assert len({s.packed.untyped_storage().data_ptr() for s in shared}) > 1  # more than one buffer used
    for k, raw, segment in zip(kinds, raws, shared):
        assert torch.equal(segment.packed, Segment.from_raw(k, raw).packed)


def test_a_tensor_packed_a_slice_of_rows_at_a_time_equals_it_packed_whole():
    """A loader reads a large tensor a slice of rows at a time and packs each at its first output
    (a multiple of 16); the last slice's padding outputs are zeroed over dirty memory."""
    rng = np.random.default_rng(5)
    kernels = native_kernels()
    for kind in ("Q4_K", "Q8_0"):
        raw = torch.from_numpy(np.ascontiguousarray(raw_tensor(kind, 53, 512, rng)))
        out = torch.full((kernels.gguf_packed_bytes(NATIVE_TYPES[kind], *raw.shape),), 0xAB, dtype=torch.uint8)
        for first, end in ((0, 32), (32, 48), (48, 53)):
            kernels.gguf_pack(raw[first:end].contiguous(), NATIVE_TYPES[kind], NO_ORDER, out, first)
        assert torch.equal(out, Segment.from_raw(kind, raw).packed)


def test_the_default_model_loaded_in_slices_equals_it_loaded_whole(monkeypatch):
    from speclm.models import builder, layer_sources
    from speclm.models.loader import load_checkpoint

    monkeypatch.setenv("SPECLM_PACK_CACHE", "off")  # both packed from the file
    whole = builder.build_model(load_checkpoint(None), weights="auto")  # the default model's GGUF file
    monkeypatch.setattr(layer_sources, "SLICE_BYTES", 1 << 16)  # every matrix in slices of rows
    sliced = builder.build_model(load_checkpoint(None), weights="auto")
    for (name, a), (_, b) in zip(whole.named_buffers(), sliced.named_buffers()):
        assert torch.equal(a, b), name


def test_prefetch_distance_changes_no_result():
    """gguf_matmul's prefetch distance is a memory hint: every distance gives the same bits (prefetches past
    the weights' end never fault), and a distance that is not a whole number of cache lines is refused."""
    kernels = native_kernels()
    rng = np.random.default_rng(3)
    raws = {k: torch.from_numpy(raw_tensor(k, 40, 512, rng)) for k in NATIVE_TYPES}
    layers = [GGUFLinear([Segment.from_raw(k, raw)], 512) for k, raw in raws.items()]
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(2))
    previous = kernels.gguf_set_prefetch(0, 0)
    try:
        plain = [(layer(x), layer(x[:1])) for layer in layers]  # a pass over several rows and over one
        for distance in (64, 2048, 1 << 20):
            kernels.gguf_set_prefetch(distance, distance)
            for layer, (rows, one) in zip(layers, plain, strict=True):
                assert torch.equal(layer(x), rows) and torch.equal(layer(x[:1]), one)
        with pytest.raises(RuntimeError, match="multiples of 64"):
            kernels.gguf_set_prefetch(100, 64)
    finally:
        kernels.gguf_set_prefetch(*previous)


def test_fused_segments_of_different_types_and_row_order():
    """A fused projection whose parts have different types (QKV with a Q6_K value projection), packed
    rows in a given order (llama's rotary permutation), and a row subset (a draft head's token map)."""
    rng = np.random.default_rng(0)
    parts = {"Q4_K": raw_tensor("Q4_K", 48, 256, rng), "Q6_K": raw_tensor("Q6_K", 16, 256, rng)}
    order = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    segments = [
        Segment.from_raw("Q4_K", torch.from_numpy(parts["Q4_K"]), order),
        Segment.from_raw("Q6_K", torch.from_numpy(parts["Q6_K"])),
    ]
    layer = GGUFLinear(segments, 256, bias=torch.arange(64.0))
    weights = [gguf.quants.dequantize(parts[k], T[k]).reshape(-1, 256) for k in ("Q4_K", "Q6_K")]
    expected = np.concatenate([weights[0][order.numpy()], weights[1]])
    assert np.array_equal(layer.dequantized_weight().numpy(), expected)
    x = torch.randn(3, 256)
    separate = torch.cat([GGUFLinear([s], 256)(x) for s in segments], dim=1) + torch.arange(64.0)
    assert torch.equal(layer(x), separate)
    single = GGUFLinear([segments[0]], 256)
    subset = torch.tensor([5, 0, 47, 16, 3])
    assert torch.equal(single.rows(subset).dequantized_weight(), single.dequantized_weight()[subset])


@pytest.mark.parametrize("kind", list(NATIVE_TYPES))
def test_requantizing_to_q4_0_equals_the_gguf_package(kind):
    """A draft's layers converted from the file's bytes to Q4_0 in one pass are byte for byte what the gguf
    package writes for the dequantized weights."""
    rng = np.random.default_rng(100 + NATIVE_TYPES[kind])
    rows, cols = 37, 512
    raw = raw_tensor(kind, rows, cols, rng)
    weights = gguf.quants.dequantize(raw, T[kind]).reshape(rows, cols)
    expected = gguf.quants.quantize(weights.astype(np.float32), T.Q4_0)
    raw = torch.from_numpy(np.ascontiguousarray(raw))
    ours = native_kernels().gguf_to_q4_0(raw, NATIVE_TYPES[kind], torch.empty(0, dtype=torch.uint8))
    assert np.array_equal(ours.numpy(), expected)
    scratch = torch.full((expected.nbytes + 100,), 7, dtype=torch.uint8)  # a loader's reused buffer
    into = native_kernels().gguf_to_q4_0(raw, NATIVE_TYPES[kind], scratch)
    assert np.array_equal(into.numpy(), expected) and into.data_ptr() == scratch.data_ptr()
