"""GGML block dequantisation in plain torch ops, for any device (the CUDA path of `weights.dequant`).

The quantised bytes are moved to the device and the values are made there. Every kernel performs the
same float32 operations, in the same order, as ``gguf.quants.dequantize`` (float16 scales widened to
float32, integer codes converted exactly, then one multiply and at most one add or subtract, each a
separate eager kernel so nothing is fused into a multiply-add); IEEE float32 arithmetic then gives the
same bits on every device. The tests compare bits with gguf on the CPU over random block bytes,
including NaN/inf/subnormal scales (NaN positions must match; NaN payloads are not compared).

Work is done in chunks of `CHUNK_BLOCKS` blocks written into the output, so the temporaries stay a few
times one chunk, never a few times the whole tensor.
"""

from __future__ import annotations

import torch

# name -> (values per block, bytes per block)
BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
CHUNK_BLOCKS = 1 << 15


def _f16(b: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block, as a float32 column (n, 1)."""
    return b[:, start:start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Bytes (n, k) -> 4-bit codes (n, 2k): the low nibbles of all bytes, then the high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """Bytes (n, k) -> their 8k bits, little-endian (bit i of byte j is item 8j + i), as 0/1 uint8."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], -1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit (scale, min) pairs packed into the 12 scale bytes of Q4_K / Q5_K, as float32."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], dim=1)
    mn = torch.cat([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], dim=1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * _f16(b, 0)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_nibbles(b[:, 2:]).to(torch.float32) - 8.0)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _nibbles(b[:, 4:]).to(torch.float32) + _f16(b, 2)


def _q5(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    high = _bits(b[:, qh_at:qh_at + 4])
    return (_nibbles(b[:, qh_at + 4:]) | (high << 4)).to(torch.float32)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_q5(b, 2) - 16.0)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _q5(b, 4) + _f16(b, 2)


def _k_affine(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(d * scale) * q - (dmin * min) per 32-value sub-block (ggml's Q4_K / Q5_K)."""
    sc, mn = _k_scales(b[:, 4:16])
    n = b.shape[0]
    d = (_f16(b, 0) * sc)[:, :, None]
    dm = (_f16(b, 2) * mn)[:, :, None]
    return (d * q.reshape(n, 8, 32) - dm).reshape(n, 256)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 256)  # sub-block 2i: low, 2i+1: high nibbles
    return _k_affine(b, q.to(torch.float32))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    qh, qs = b[:, 16:48], b[:, 48:176].reshape(-1, 4, 32)
    low = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)[None, :, None]
    high = (qh[:, None, :] >> shifts) & 1  # sub-block s uses bit s of each of the 32 bytes
    return _k_affine(b, (low | (high << 4)).reshape(-1, 256).to(torch.float32))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # (n, 2, 128)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device)[None, None, :, None]
    high = ((qh[:, :, None, :] >> shifts) & 3).reshape(n, 2, 128)
    q = (low | (high << 4)).to(torch.float32) - 32.0
    d = _f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    return (d[:, :, None] * q.reshape(n, 16, 16)).reshape(n, 256)


KERNELS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
           "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dequantize_blocks(raw: torch.Tensor, qtype_name: str, dtype: torch.dtype = torch.float32,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode a uint8 tensor of whole `qtype_name` blocks (on any device) into a flat tensor there.

    Returns ``blocks * values_per_block`` values of `dtype` (float32 values, then cast with torch's
    ``.to(dtype)``: round to nearest even for float16/bfloat16), or fills `out` (same device, that
    many elements, contiguous) and returns it. The caller has checked the type and the byte count.
    """
    block_values, block_bytes = BLOCKS[qtype_name]
    kernel = KERNELS[qtype_name]
    blocks = raw.reshape(-1, block_bytes)
    n = blocks.shape[0]
    if out is None:
        out = torch.empty(n * block_values, dtype=dtype, device=raw.device)
    flat = out.view(-1)
    for start in range(0, n, CHUNK_BLOCKS):
        chunk = blocks[start:start + CHUNK_BLOCKS]
        values = kernel(chunk).reshape(-1)
        flat[start * block_values:start * block_values + values.numel()].copy_(values)
    return out


__all__ = ["BLOCKS", "CHUNK_BLOCKS", "dequantize_blocks"]
