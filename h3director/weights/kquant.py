"""K-quant encoders (Q4_K, Q5_K, Q6_K) in vectorised numpy, for `convert --type Q6_K|Q5_K|Q4_K|Q4_K_M`
(gguf's quantiser has no K-quant encoder).

Every function takes float32 ``(..., k)`` with ``k`` a multiple of 256 and returns uint8 ``(..., k / 256 *
block_bytes)``: ggml's blocks of 256 values, which every GGUF reader (gguf's reference decoder, the native
core, the torch kernels, ComfyUI-GGUF, llama.cpp) decodes. Block layouts (bytes):

- Q4_K (144): float16 ``d``, float16 ``dmin``, 12 bytes of eight 6-bit sub-block scales and eight 6-bit mins
  (ggml's packing), 128 bytes of 4-bit codes (byte ``32 i + l``: value ``l`` of sub-block ``2 i`` in the low
  nibble, of sub-block ``2 i + 1`` in the high nibble). Value = ``(d * sc_j) * q - (dmin * mn_j)``, q in 0..15,
  eight sub-blocks of 32 values.
- Q5_K (176): as Q4_K, then 32 bytes ``qh`` (bit ``j`` of byte ``l``: the fifth bit of value ``l`` of
  sub-block ``j``), then the 128 bytes of low nibbles. q in 0..31.
- Q6_K (210): 128 bytes ``ql`` (low 4 bits), 64 bytes ``qh`` (high 2 bits), sixteen int8 sub-block scales,
  float16 ``d``. Two halves of 128 values; in half ``h`` value ``v``: low nibble of ``ql[64 h + v % 64]``
  (high nibble when ``v >= 64``), bits ``2 (v // 32)`` of ``qh[32 h + v % 32]``. Value = ``(d * sc_j) *
  (q - 32)``, sixteen sub-blocks of 16 values, q - 32 in -32..31 (this encoder uses -31..31).

The encoding (this module's own; no scale search): per sub-block the range is covered so that no code is
ever clipped, and codes are rounded to nearest. That gives a guaranteed bound on every value's error:

- Q6_K (symmetric): ideal step ``s_j = max|x| / 31``; ``d = max_j s_j / 127`` rounded *up* to float16;
  ``sc_j = ceil(s_j / d)`` (<= 127); the stored step ``S_j = d * sc_j`` is in ``[s_j, s_j + d]``.
- Q4_K / Q5_K (affine, ``L`` = 15 / 31): ``m_j = max(0, -min x)``; ``dmin = max_j m_j / 63`` rounded up to
  float16; ``mn_j = ceil(m_j / dmin)``, stored offset ``M_j = dmin * mn_j >= m_j``; ideal step ``s_j = (max x +
  M_j) / L``; ``d = max_j s_j / 63`` rounded up; ``sc_j = ceil(s_j / d)``; ``S_j = d * sc_j >= s_j``.
- Then ``q = rint(x / S_j)`` (+32 for Q6_K) or ``rint((x + M_j) / S_j)``: never outside the code range, so
  ``|x - decoded| <= S_j / 2`` (plus float32 rounding of the decoder's multiply and subtract).

So the error per value is at most half the stored step, and the stored step exceeds the ideal one by at
most ``d`` (the rounding of the sub-block scale to its integer code; ``d`` and ``dmin`` are at least float16's
smallest step, 2^-24, so a block of values below about 1e-6 is quantised in steps of at least 6e-8): RMS error of uniform noise,
``S / sqrt(12)``, orders Q6_K (``S ~ max|x| / 31`` over 16 values) < Q5_K (``range / 31``) < Q4_K
(``range / 15``). llama.cpp's encoders search the scales (and clip outliers) for a lower RMS error; files
written here are valid K-quant files with a somewhat higher error and a hard per-value bound.

Non-finite input values and scales beyond float16's range raise `InvalidInputError`.
"""

from __future__ import annotations

import numpy as np

from h3director.errors import InvalidInputError

QK_K = 256
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
CHUNK_BLOCKS = 1 << 14  # 4 Mi values (16 MiB of float32) per encoder call in `quantize`


def _rows(values: np.ndarray, name: str, sub: int) -> np.ndarray:
    """Check `values` and view them as (n_blocks, 256 / sub, sub) float32."""
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % QK_K:
        raise InvalidInputError(f"{name} needs rows of whole {QK_K}-value blocks, got shape {list(values.shape)}")
    if not np.isfinite(values).all():
        raise InvalidInputError(f"{name}: the values hold NaN or infinity, which a K-quant block cannot encode")
    return values.reshape(-1, QK_K // sub, sub)


def _f16_at_least(target: np.ndarray, name: str) -> np.ndarray:
    """The smallest float16 >= `target` (float32, >= 0), elementwise; refuses values beyond float16."""
    with np.errstate(over="ignore"):
        half = target.astype(np.float16)
    below = half.astype(np.float32) < target
    half = np.where(below, np.nextafter(half, np.float16(np.inf)), half)
    if not np.isfinite(half).all():
        raise InvalidInputError(f"{name}: a block scale of {float(target.max()):.3g} is beyond float16's range")
    return half


def _codes(ideal: np.ndarray, unit: np.ndarray, top: int) -> np.ndarray:
    """ceil(ideal / unit) per sub-block as integers in 0..top (0 where unit is 0); float32 (n, subs)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        code = np.where(unit > 0, np.ceil(ideal / unit), 0)
    return np.clip(code, 0, top).astype(np.float32)


def _pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins (n, 8) -> the 12 packed bytes (n, 12) ggml's get_scale_min reads."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    a = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    b = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    c = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([a, b, c], axis=1)


def _affine(values: np.ndarray, name: str, levels: int):
    """Q4_K / Q5_K common part: (d, dmin float16 (n,), packed scales (n, 12), codes uint8 (n, 8, 32))."""
    x = _rows(values, name, 32)
    mins = np.maximum(np.float32(0), -x.min(axis=2))                         # (n, 8)
    dmin = _f16_at_least(mins.max(axis=1) / np.float32(63), name)
    dmin32 = dmin.astype(np.float32)[:, None]
    mn = _codes(mins, dmin32, 63)
    offset = dmin32 * mn                                                     # stored offsets, >= mins
    ideal = (x.max(axis=2) + offset) / np.float32(levels)
    d = _f16_at_least(ideal.max(axis=1) / np.float32(63), name)
    d32 = d.astype(np.float32)[:, None]
    sc = _codes(ideal, d32, 63)
    step = (d32 * sc)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.rint((x + offset[:, :, None]) / step), 0)
    q = np.clip(q, 0, levels).astype(np.uint8)
    return d, dmin, _pack_scales(sc, mn), q


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """Codes (n, 8, 32) -> 128 bytes per block: sub-block 2i in the low nibble, 2i+1 in the high one."""
    q = q & 0x0F
    return (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(q.shape[0], 128)


def _head(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray) -> np.ndarray:
    n = d.shape[0]
    return np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8), scales], axis=1)


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """float32 (..., k) with k a multiple of 256 -> uint8 (..., k / 256 * 144) Q4_K blocks."""
    lead = np.shape(values)[:-1]
    d, dmin, scales, q = _affine(values, "Q4_K", 15)
    return np.concatenate([_head(d, dmin, scales), _nibble_pairs(q)], axis=1).reshape(*lead, -1)


def quantize_q5_k(values: np.ndarray) -> np.ndarray:
    """float32 (..., k) with k a multiple of 256 -> uint8 (..., k / 256 * 176) Q5_K blocks."""
    lead = np.shape(values)[:-1]
    d, dmin, scales, q = _affine(values, "Q5_K", 31)
    weights = (1 << np.arange(8, dtype=np.uint16))[None, :, None]             # sub-block j -> bit j
    qh = ((q >> 4).astype(np.uint16) * weights).sum(axis=1).astype(np.uint8)  # (n, 32)
    return np.concatenate([_head(d, dmin, scales), qh, _nibble_pairs(q)], axis=1).reshape(*lead, -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """float32 (..., k) with k a multiple of 256 -> uint8 (..., k / 256 * 210) Q6_K blocks."""
    lead = np.shape(values)[:-1]
    x = _rows(values, "Q6_K", 16)                                            # (n, 16, 16)
    n = x.shape[0]
    ideal = np.abs(x).max(axis=2) / np.float32(31)                           # (n, 16)
    d = _f16_at_least(ideal.max(axis=1) / np.float32(127), "Q6_K")
    d32 = d.astype(np.float32)[:, None]
    sc = _codes(ideal, d32, 127)
    step = (d32 * sc)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step > 0, np.rint(x / step), 0)
    q = (np.clip(q, -31, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)     # half, quarter, lane
    low, high = q & 0x0F, q >> 4
    ql = (low[:, :, 0:2, :] | (low[:, :, 2:4, :] << 4)).reshape(n, 128)      # values v and v + 64 share a byte
    qh = (high[:, :, 0, :] | (high[:, :, 1, :] << 2) | (high[:, :, 2, :] << 4)
          | (high[:, :, 3, :] << 6)).reshape(n, 64)
    blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)
    return blocks.reshape(*lead, -1)


ENCODERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(values: np.ndarray, qtype_name: str) -> np.ndarray:
    """Encode float32 `values` (..., k), k a multiple of 256, as `qtype_name` (one of `ENCODERS`): uint8
    (..., k / 256 * block bytes). Works through `CHUNK_BLOCKS` blocks at a time, so the encoder's
    temporaries stay a few times 16 MiB whatever the tensor's size (the output is the only full-size
    allocation). `InvalidInputError` for a type without an encoder here, or rows that do not hold whole
    256-value blocks."""
    if qtype_name not in ENCODERS:
        raise InvalidInputError(f"no encoder for {qtype_name}; this module writes {', '.join(ENCODERS)}")
    values = np.asarray(values, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % QK_K:
        raise InvalidInputError(f"{qtype_name} needs rows of whole {QK_K}-value blocks, got shape {list(values.shape)}")
    blocks = values.reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], BLOCK_BYTES[qtype_name]), dtype=np.uint8)
    for start in range(0, blocks.shape[0], CHUNK_BLOCKS):
        out[start:start + CHUNK_BLOCKS] = ENCODERS[qtype_name](blocks[start:start + CHUNK_BLOCKS])
    return out.reshape(*values.shape[:-1], -1)


__all__ = ["BLOCK_BYTES", "CHUNK_BLOCKS", "ENCODERS", "quantize"]
