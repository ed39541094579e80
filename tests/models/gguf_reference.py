"""Independent numpy decoders of GGML block formats (written from the ggml block layouts), used as the
reference for our GGUF dequantization; blocks are rows of raw bytes [num_blocks, block_bytes]."""

from __future__ import annotations

import numpy as np


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from 2 bytes per row: [n, 2] -> [n, 1] float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def q8_0(b):  # 34 bytes: d, 32 x int8
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def q4_0(b):  # 18 bytes: d, 16 bytes of nibbles (low nibbles are values 0..15, high 16..31)
    q = b[:, 2:]
    vals = np.concatenate([q & 0xF, q >> 4], axis=1).astype(np.float32) - 8
    return _f16(b[:, :2]) * vals


def q4_1(b):  # 20 bytes: d, m, 16 bytes of nibbles
    q = b[:, 4:]
    vals = np.concatenate([q & 0xF, q >> 4], axis=1).astype(np.float32)
    return _f16(b[:, :2]) * vals + _f16(b[:, 2:4])


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit (scale, min) pairs packed in 12 bytes of Q4_K / Q5_K: [n, 8] each."""
    sc = np.zeros((scales.shape[0], 8), np.float32)
    mn = np.zeros_like(sc)
    for j in range(8):
        if j < 4:
            sc[:, j] = scales[:, j] & 63
            mn[:, j] = scales[:, j + 4] & 63
        else:
            sc[:, j] = (scales[:, j + 4] & 0xF) | ((scales[:, j - 4] >> 6) << 4)
            mn[:, j] = (scales[:, j + 4] >> 4) | ((scales[:, j] >> 6) << 4)
    return sc, mn


def q4_k(b):  # 144 bytes: d, dmin, scales[12], qs[128]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 16:]
    out = []
    for chunk in range(4):  # 64 values per chunk: 32 low nibbles (sub-block 2c), 32 high (2c+1)
        q = qs[:, 32 * chunk : 32 * chunk + 32]
        out.append(d * sc[:, [2 * chunk]] * (q & 0xF) - dmin * mn[:, [2 * chunk]])
        out.append(d * sc[:, [2 * chunk + 1]] * (q >> 4) - dmin * mn[:, [2 * chunk + 1]])
    return np.concatenate(out, axis=1)


def q5_k(b):  # 176 bytes: d, dmin, scales[12], qh[32], qs[128]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qh, qs = b[:, 16:48], b[:, 48:]
    out = []
    for chunk in range(4):
        q = qs[:, 32 * chunk : 32 * chunk + 32]
        lo = (q & 0xF) + 16 * ((qh >> (2 * chunk)) & 1)
        hi = (q >> 4) + 16 * ((qh >> (2 * chunk + 1)) & 1)
        out.append(d * sc[:, [2 * chunk]] * lo - dmin * mn[:, [2 * chunk]])
        out.append(d * sc[:, [2 * chunk + 1]] * hi - dmin * mn[:, [2 * chunk + 1]])
    return np.concatenate(out, axis=1)


def q6_k(b):  # 210 bytes: ql[128], qh[64], scales[16] int8, d
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8).astype(np.float32), _f16(b[:, 208:])
    out = np.zeros((b.shape[0], 256), np.float32)
    for half in range(2):  # 128 values each
        l_lo, l_hi, h = (
            ql[:, 64 * half : 64 * half + 32],
            ql[:, 64 * half + 32 : 64 * half + 64],
            qh[:, 32 * half : 32 * half + 32],
        )
        quarters = [
            (l_lo & 0xF) | (((h >> 0) & 3) << 4),
            (l_hi & 0xF) | (((h >> 2) & 3) << 4),
            (l_lo >> 4) | (((h >> 4) & 3) << 4),
            (l_hi >> 4) | (((h >> 6) & 3) << 4),
        ]
        for k, q in enumerate(quarters):
            for sub in range(2):  # 16 values share one scale
                scale = scales[:, [8 * half + 2 * k + sub]]
                cols = slice(128 * half + 32 * k + 16 * sub, 128 * half + 32 * k + 16 * sub + 16)
                out[:, cols] = d * scale * (q[:, 16 * sub : 16 * sub + 16].astype(np.float32) - 32)
    return out


def bf16(b):  # 2 bytes per value: the top half of an fp32
    return (np.ascontiguousarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


BLOCK = {
    "Q8_0": (32, 34, q8_0),
    "Q4_0": (32, 18, q4_0),
    "Q4_1": (32, 20, q4_1),
    "Q4_K": (256, 144, q4_k),
    "Q5_K": (256, 176, q5_k),
    "Q6_K": (256, 210, q6_k),
}


def dequantize_rows(raw: np.ndarray, kind: str, row_length: int) -> np.ndarray:
    """Decode raw bytes [rows, bytes_per_row] of GGML type `kind` into float32 [rows, row_length]."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.shape[0]
    if kind == "BF16":
        return bf16(raw.reshape(rows, -1)).reshape(rows, row_length)
    values, size, fn = BLOCK[kind]
    blocks = raw.reshape(rows * row_length // values, size)
    return fn(blocks).reshape(rows, row_length)
