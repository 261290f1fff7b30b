"""GGUF dequantisation: bit-identical to gguf.quants.dequantize, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_helpers import backend_params

from h3director import native
from h3director.errors import InvalidInputError

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


def assert_same_bits(got: np.ndarray, ref: np.ndarray) -> None:
    """Equal shape and dtype, NaN in the same places, identical bits everywhere else."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    ints = {2: np.uint16, 4: np.uint32}[ref.dtype.itemsize]
    np.testing.assert_array_equal(got.view(ints)[~nan], ref.view(ints)[~nan])


def _random_blocks(name: str, rng: np.random.Generator, lead: tuple[int, ...], blocks: int) -> np.ndarray:
    _, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    return rng.integers(0, 256, size=(*lead, blocks * type_size), dtype=np.uint8)


def _finite_scale_blocks(name: str, rng: np.random.Generator, blocks: int) -> np.ndarray:
    """Random blocks whose float16 scales are ordinary numbers (as real files have)."""
    data = _random_blocks(name, rng, (), blocks)
    _, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    rows = data.reshape(blocks, type_size)
    offsets = {"Q6_K": [208]}.get(name, [0, 2] if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for off in offsets:
        rows[:, off:off + 2] = rng.normal(0, 0.05, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 3), blocks=st.integers(1, 6))
def test_float32_matches_gguf_on_random_bytes(backend, name, seed, rows, blocks):
    data = _random_blocks(name, np.random.default_rng(seed), (rows,), blocks)
    with np.errstate(all="ignore"):
        ref = quants.dequantize(data, gguf.GGMLQuantizationType[name])
    got = native.dequantize(data, gguf.GGMLQuantizationType[name], backend=backend)
    assert_same_bits(got, ref)


@pytest.mark.parametrize("name", TYPES)
def test_all_dtypes_match_references_on_realistic_blocks(backend, name):
    data = _finite_scale_blocks(name, np.random.default_rng(len(name) * 7 + TYPES.index(name)), 64)
    ref = quants.dequantize(data, gguf.GGMLQuantizationType[name])
    assert np.isfinite(ref).all()
    assert_same_bits(native.dequantize(data, name, backend=backend), ref)
    assert_same_bits(native.dequantize(data, name, np.float16, backend=backend), ref.astype(np.float16))
    got_bf16 = native.dequantize(data, name, torch.bfloat16, backend=backend)
    assert got_bf16.dtype == torch.bfloat16
    ref_bf16 = torch.from_numpy(ref).to(torch.bfloat16)
    assert torch.equal(got_bf16.view(torch.int16), ref_bf16.view(torch.int16))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1))
def test_half_precision_outputs_round_like_numpy_and_torch_on_random_bytes(backend, name, seed):
    data = _random_blocks(name, np.random.default_rng(seed), (2,), 3)
    with np.errstate(all="ignore"):
        ref = quants.dequantize(data, gguf.GGMLQuantizationType[name])
        assert_same_bits(native.dequantize(data, name, "float16", backend=backend), ref.astype(np.float16))
    got = native.dequantize(data, name, "bfloat16", backend=backend).view(torch.int16).numpy().view(np.uint16)
    want = torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert (got[nan] == 0xFFFF).all()  # the documented NaN encoding


def test_float16_rounding_edges_match_numpy(backend):
    # Q8_0 values q * d cover overflow past 65504, subnormals and ties when d sweeps these scales.
    scales = np.array([65504, 1000, 515.9, 1.0, 2.0**-14, 2.0**-20, 2.0**-24, 6.1e-5, 3.0e-8], dtype=np.float16)
    blocks = np.zeros((len(scales), 34), dtype=np.uint8)
    blocks[:, 0:2] = scales.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = np.arange(-127, 128, 8, dtype=np.int8)[:32].view(np.uint8)
    ref = quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)
    with np.errstate(over="ignore"):
        assert_same_bits(native.dequantize(blocks, "Q8_0", np.float16, backend=backend), ref.astype(np.float16))


def test_writes_into_a_caller_buffer_in_an_arena(backend):
    data = _finite_scale_blocks("Q4_K", np.random.default_rng(3), 8).reshape(2, -1)
    ref = quants.dequantize(data, gguf.GGMLQuantizationType.Q4_K)
    arena = native.Arena(1 << 20, backend=backend)
    with arena.lease(ref.nbytes) as lease:
        out = lease.numpy(np.float32, ref.shape)
        assert native.dequantize(data, "Q4_K", out=out, backend=backend) is out
        assert_same_bits(out, ref)
        out_t = lease.torch(torch.bfloat16, ref.shape)
        native.dequantize(data, "Q4_K", torch.bfloat16, out=out_t, backend=backend)
        assert torch.equal(out_t, torch.from_numpy(ref).to(torch.bfloat16))


def test_accepts_name_enum_and_value_and_multi_axis_shapes(backend):
    data = _finite_scale_blocks("Q8_0", np.random.default_rng(5), 12).reshape(2, 3, 68)
    ref = quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0)
    for qtype in ("Q8_0", "q8_0", gguf.GGMLQuantizationType.Q8_0, 8):
        assert_same_bits(native.dequantize(data, qtype, backend=backend), ref)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"data": np.zeros((2, 35), np.uint8), "qtype": "Q8_0"}, "not a whole number of 34-byte blocks"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q2_K"}, "unsupported quantisation type"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q8_0", "dtype": np.int32}, "unsupported dtype"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q8_0", "out": np.zeros(31, np.float32)}, "expected (32,)"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q8_0", "out": np.zeros(32, np.float16)}, "expected float32"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q8_0", "out": np.zeros(64, np.float32)[::2]}, "C-contiguous"),
        ({"data": np.zeros(34, np.uint8), "qtype": "Q8_0", "threads": 0}, "threads"),
    ],
)
def test_bad_arguments_raise_before_any_work(backend, kwargs, message):
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        native.dequantize(backend=backend, **kwargs)


def test_rejects_non_arrays(backend):
    with pytest.raises(TypeError, match="numpy uint8 array"):
        native.dequantize(b"\x00" * 34, "Q8_0", backend=backend)


def test_empty_input_gives_empty_output(backend):
    assert native.dequantize(np.zeros((0, 34), np.uint8), "Q8_0", backend=backend).shape == (0, 32)
