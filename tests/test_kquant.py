"""The project's K-quant encoders (`h3director.weights.kquant`: Q4_K, Q5_K, Q6_K) and convert's Q4_K_M mix rule.

What the encoders write is decoded by gguf's reference code (`gguf.quants.dequantize`) and by every project
dequantiser (native C, its numpy twin, the torch kernels): all must give the same bits. The error against the
float input is checked against the bound the encoding guarantees, derived from the float values alone (see the
kquant module docstring): per sub-block, ``|x - decoded| <= S / 2`` with the stored step
``S <= s + d``, where ``s`` is the ideal step (Q6_K: ``max|x| / 31``; Q4_K / Q5_K with L = 15 / 31 levels:
``(max x + M) / L`` with the stored offset ``M <= m + dmin``, ``m = max(0, -min x)``) and ``d`` / ``dmin`` the
block's super-scales (the largest ideal step / 127 or 63, rounded up to float16: at most 2^-10 relative, or
2^-24 absolute in float16's subnormal range).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from native_helpers import backend_params

from h3director.errors import InvalidInputError
from h3director.weights import kquant
from h3director.weights.convert import TYPES, mix_type, use_more_bits
from h3director.weights.dequant import dequantize_tensor

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
K_TYPES = ("Q6_K", "Q5_K", "Q4_K")
F16_UP = 1 + 2.0 ** -10  # float16 rounding up of a positive normal value: at most one ulp
F16_TINY = 2.0 ** -24    # ... and of a value in float16's subnormal range: at most its spacing


def _f16_up(value):
    return value * F16_UP + F16_TINY


def _bound(x: np.ndarray, type_name: str) -> np.ndarray:
    """The largest error each value may have (per sub-block bound, broadcast to x's shape), from x alone."""
    if type_name == "Q6_K":
        sub = x.reshape(-1, 16, 16)
        ideal = np.abs(sub).max(axis=2).astype(np.float64) / 31
        d = _f16_up(ideal.max(axis=1, keepdims=True) / 127)
    else:
        levels = 15 if type_name == "Q4_K" else 31
        sub = x.reshape(-1, 8, 32).astype(np.float64)
        m = np.maximum(0, -sub.min(axis=2))
        dmin = _f16_up(m.max(axis=1, keepdims=True) / 63)
        ideal = (sub.max(axis=2) + m + dmin) / levels  # with the largest stored offset M = m + dmin
        d = _f16_up(ideal.max(axis=1, keepdims=True) / 63)
    step = ideal + d
    # float32 rounding of the decoder's multiply and subtract (a few ulp of the largest term)
    slack = 4 * np.finfo(np.float32).eps * (np.abs(sub).max(axis=2) + step * 64)
    return np.broadcast_to((step / 2 + slack)[:, :, None], sub.shape).reshape(x.shape)


def _decoders(raw: np.ndarray, type_name: str, shape, native_backend: str) -> dict[str, torch.Tensor]:
    out = {"gguf": torch.from_numpy(gguf.quants.dequantize(raw, Q[type_name]).copy()).reshape(shape)}
    for backend in (native_backend, "torch"):
        out[backend] = dequantize_tensor(raw, type_name, shape, backend=backend)
    return out


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    normal = (rng.standard_normal((32, 1024)) * 0.05).astype(np.float32)
    special = np.zeros((8, 256), np.float32)
    special[1] = 0.25                                                # constant positive
    special[2] = -np.abs(rng.standard_normal(256)) * 3               # all negative
    special[3] = np.abs(rng.standard_normal(256)) * 1e-3             # all positive, small
    special[4] = rng.standard_normal(256) * 1e-4
    special[4, 17] = 40.0                                            # one outlier in the block
    special[5] = rng.standard_normal(256) * np.repeat(10.0 ** rng.uniform(-4, 1, 16), 16)  # sub-blocks 1e-4..10
    special[6] = rng.standard_normal(256) * 1e-7                     # super-scales near float16's subnormals
    special[7] = np.linspace(-1, 2, 256)
    return {"normal": normal, "special": special}


@pytest.mark.parametrize("native_backend", backend_params())
@pytest.mark.parametrize("type_name", K_TYPES)
@pytest.mark.parametrize("case", ["normal", "special"])
def test_every_decoder_gives_gguf_bits_and_the_error_is_within_the_bound(type_name, case, native_backend):
    x = _cases()[case]
    raw = kquant.quantize(x, type_name)
    values, nbytes = gguf.GGML_QUANT_SIZES[Q[type_name]]
    assert raw.dtype == np.uint8 and raw.shape == (x.shape[0], x.shape[1] // values * nbytes)
    decoded = _decoders(raw, type_name, x.shape, native_backend)
    reference = decoded.pop("gguf")
    for backend, got in decoded.items():
        assert torch.equal(got.view(torch.int32), reference.view(torch.int32)), backend
    error = np.abs(reference.numpy().astype(np.float64) - x)
    bound = _bound(x, type_name)
    worst = np.unravel_index(np.argmax(error - bound), x.shape)
    assert (error <= bound).all(), (worst, error[worst], bound[worst])
    if case == "special":
        assert (reference[0] == 0).all()                       # an all-zero block decodes to zeros
        assert error[1].max() <= 0.25 * 2 ** -8                 # a constant is nearly exact


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), exponent=st.floats(-6, 3), spread=st.floats(0, 4),
       type_name=st.sampled_from(K_TYPES))
def test_bound_holds_for_random_blocks_of_any_scale(seed, exponent, spread, type_name):
    rng = np.random.default_rng(seed)
    scales = 10.0 ** (exponent + rng.uniform(-spread, 0, 32))        # per 16 values, up to 1e4 apart
    x = (rng.standard_normal(512) * np.repeat(scales, 16) + rng.uniform(-1, 1) * 10.0 ** exponent)
    x = x.astype(np.float32).reshape(2, 256)
    raw = kquant.quantize(x, type_name)
    decoded = gguf.quants.dequantize(raw, Q[type_name])
    assert (np.abs(decoded.astype(np.float64) - x) <= _bound(x, type_name)).all()


def test_rms_error_orders_q6_k_q5_k_q4_k_and_bits_follow():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 2048)) * 0.02).astype(np.float32)
    rms = {}
    for type_name in K_TYPES:
        decoded = gguf.quants.dequantize(kquant.quantize(x, type_name), Q[type_name])
        rms[type_name] = float(np.sqrt(np.mean((decoded.astype(np.float64) - x) ** 2)))
    # one more bit halves the step: each type at most about 0.6x the next coarser one
    assert rms["Q6_K"] < 0.6 * rms["Q5_K"] < 0.6 * 0.6 * rms["Q4_K"], rms


@pytest.mark.parametrize("type_name", K_TYPES)
def test_refuses_bad_input(type_name):
    with pytest.raises(InvalidInputError, match="whole 256-value blocks"):
        kquant.quantize(np.zeros((2, 300), np.float32), type_name)
    bad = np.zeros((1, 256), np.float32)
    bad[0, 3] = np.nan
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        kquant.quantize(bad, type_name)
    with pytest.raises(InvalidInputError, match="beyond float16"):
        kquant.quantize(np.full((1, 256), 3e9, np.float32), type_name)


def test_q4_k_m_follows_llama_cpps_layer_choice():
    # llama.cpp's rule: first and last eighth, and every third layer between: 16 of a 32-layer model
    chosen = [i for i in range(32) if use_more_bits(i, 32)]
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert sum(use_more_bits(i, 50) for i in range(50)) == 25  # H3's 50 blocks: half
    counts = {"blocks.": 50, "token_refiner.blocks.": 2}
    kinds = {name: mix_type(name, "Q4_K", "Q6_K", counts) for name in (
        "blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc2.weight", "blocks.7.mlp.fc2.weight",
        "blocks.8.attn.qkv_proj.weight", "blocks.0.attn.out_proj.weight", "blocks.0.mlp.fc1.weight",
        "token_refiner.blocks.0.mlp.fc2.weight", "token_refiner.blocks.1.mlp.fc2.weight", "condition_proj.weight",
        "blocks.0.adaln_proj.linear.weight")}
    assert [k for k, v in kinds.items() if v == "Q6_K"] == [
        "blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc2.weight", "blocks.8.attn.qkv_proj.weight",
        "token_refiner.blocks.1.mlp.fc2.weight"]
    assert {"Q6_K", "Q5_K", "Q4_K", "Q4_K_M", "Q8_0"} <= set(TYPES)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_chunked_encoding_equals_one_call(monkeypatch, type_name):
    x = _cases()["normal"][:5]                       # 20 blocks: chunks of 3 leave a partial last chunk
    whole = kquant.ENCODERS[type_name](x)
    monkeypatch.setattr(kquant, "CHUNK_BLOCKS", 3)
    chunked = kquant.quantize(x.reshape(5, 2, 512), type_name)
    assert chunked.shape == (5, 2, 2 * kquant.BLOCK_BYTES[type_name])
    assert np.array_equal(chunked.reshape(whole.shape), whole)
