"""h3director.weights: the validating GGUF reader, the dequantiser dispatch and H3 key recognition.

Files are real GGUFs written by gguf's own GGUFWriter; references are gguf.quants.dequantize.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3director.errors import InvalidInputError
from h3director.weights import dequant_torch
from h3director.weights.dequant import SUPPORTED_QTYPES, dequantize_tensor
from h3director.weights.gguf_file import open_gguf
from h3director.weights.h3_keys import detect_h3, is_high_precision, split_components

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

TYPES = list(dequant_torch.BLOCKS)
# float16 bit patterns at the edges: +-inf, NaN, largest finite, smallest normal and subnormal, zeros
EXTREME_F16 = [0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0xFBFF, 0x0400, 0x0001, 0x8001, 0x0000, 0x8000, 0x3C00]
SCALE_OFFSETS = {"Q8_0": [0], "Q4_0": [0], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2],
                 "Q5_K": [0, 2], "Q6_K": [208]}


def assert_same_bits(got: torch.Tensor, ref: np.ndarray) -> None:
    got = got.cpu().numpy().reshape(ref.shape)
    assert got.dtype == ref.dtype
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])


def _reference(data: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return quants.dequantize(data, Q[name])


# ---------------------------------------------------------------------------------------------- dequant


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(TYPES), seed=st.integers(0, 2**32 - 1), blocks=st.integers(1, 9),
       extremes=st.lists(st.sampled_from(EXTREME_F16), min_size=0, max_size=4))
def test_torch_kernels_match_gguf_bit_for_bit_on_random_blocks(name, seed, blocks, extremes):
    _, size = dequant_torch.BLOCKS[name]
    data = np.random.default_rng(seed).integers(0, 256, size=(blocks, size), dtype=np.uint8)
    for i, bits in enumerate(extremes):  # plant edge-case scales in some blocks
        off = SCALE_OFFSETS[name][i % len(SCALE_OFFSETS[name])]
        data[i % blocks, off:off + 2] = np.frombuffer(struct.pack("<H", bits), dtype=np.uint8)
    ref = _reference(data, name)
    got = dequant_torch.dequantize_blocks(torch.from_numpy(data.copy()), name)
    assert_same_bits(got, ref)


def test_torch_kernels_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(dequant_torch, "CHUNK_BLOCKS", 3)
    for name in TYPES:
        _, size = dequant_torch.BLOCKS[name]
        data = np.random.default_rng(7).integers(0, 256, size=(10, size), dtype=np.uint8)
        assert_same_bits(dequant_torch.dequantize_blocks(torch.from_numpy(data), name), _reference(data, name))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("backend", [None, "torch", "numpy"])
def test_dispatch_matches_gguf_in_every_dtype_and_fills_out(name, backend):
    values, size = dequant_torch.BLOCKS[name]
    rng = np.random.default_rng(TYPES.index(name))
    data = rng.integers(0, 256, size=(3, 2 * size), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:  # ordinary finite scales, so float16/bfloat16 casts compare exactly
        data.reshape(-1, size)[:, off:off + 2] = rng.normal(0, 0.02, (6, 1)).astype(np.float16).view(np.uint8)
    ref = _reference(data, name)
    shape = (3, 2 * values)
    got = dequantize_tensor(data, Q[name], shape, backend=backend)
    assert got.shape == shape
    assert_same_bits(got, ref)
    for dtype in (torch.float16, torch.bfloat16):
        expect = torch.from_numpy(ref).to(dtype)
        buffer = torch.full(shape, 7.0, dtype=dtype)
        result = dequantize_tensor(data, Q[name], shape, dtype=dtype, out=buffer, backend=backend)
        assert result.data_ptr() == buffer.data_ptr()
        assert torch.equal(result.view(torch.int16), expect.view(torch.int16))


def test_float_types_are_cast_copies_of_the_stored_values():
    a = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    got = dequantize_tensor(a.view(np.uint8).reshape(-1), Q.F32, (4, 6))
    assert torch.equal(got, torch.from_numpy(a))
    half = dequantize_tensor(a.astype(np.float16).view(np.uint8).reshape(-1), Q.F16, (4, 6), dtype=torch.float32)
    assert torch.equal(half, torch.from_numpy(a.astype(np.float16).astype(np.float32)))
    bf = torch.from_numpy(a).to(torch.bfloat16)
    raw = bf.view(torch.int16).numpy().view(np.uint8).reshape(-1)
    assert torch.equal(dequantize_tensor(raw, Q.BF16, (4, 6), dtype=torch.bfloat16), bf)
    assert SUPPORTED_QTYPES >= {Q.F32, Q.F16, Q.BF16, *(Q[t] for t in TYPES)}


def test_dispatch_refuses_wrong_byte_counts_and_types():
    with pytest.raises(InvalidInputError, match="needs 34 bytes, got 33"):
        dequantize_tensor(np.zeros(33, np.uint8), Q.Q8_0, (1, 32))
    with pytest.raises(InvalidInputError, match="whole 256-value blocks"):
        dequantize_tensor(np.zeros(144, np.uint8), Q.Q4_K, (2, 128))
    with pytest.raises(InvalidInputError, match="unsupported tensor type 'IQ2_XXS'"):
        dequantize_tensor(np.zeros(66, np.uint8), Q.IQ2_XXS, (1, 256))


# ---------------------------------------------------------------------------------------------- reader


def write_gguf(path, tensors, arch="minimax_h3", extra=None):
    """A real GGUF by gguf.GGUFWriter: `tensors` maps name -> (float32 array, qtype name)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (extra or {}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    for name, (array, qtype) in tensors.items():
        if qtype in ("F32", "F16"):
            writer.add_tensor(name, array.astype(np.float32 if qtype == "F32" else np.float16))
        else:
            writer.add_tensor(name, quants.quantize(array, Q[qtype]), raw_dtype=Q[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def small_gguf(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {
        "blocks.0.mlp.fc1.weight": (rng.standard_normal((8, 64)).astype(np.float32), "Q8_0"),
        "blocks.0.attn.qkv_proj.weight": (rng.standard_normal((4, 32)).astype(np.float32), "Q4_0"),
        "video_patch_proj.weight": (rng.standard_normal((6, 4)).astype(np.float32), "F32"),
        "norm.weight": (rng.standard_normal(6).astype(np.float32), "F16"),
    }
    path = write_gguf(tmp_path / "small.gguf", tensors,
                      extra={"comfy.gguf.orig_shape.video_patch_proj.weight": [6, 2, 2], "demo.text": "hello"})
    return path, tensors


def test_open_reads_shapes_types_metadata_and_maps_the_bytes(small_gguf):
    path, tensors = small_gguf
    with open_gguf(path) as f:
        assert f.architecture == "minimax_h3"
        assert f.metadata["demo.text"] == "hello"
        assert list(f.tensors) == list(tensors)
        fc1 = f.tensors["blocks.0.mlp.fc1.weight"]
        assert (fc1.shape, fc1.qtype, fc1.nbytes) == ((8, 64), Q.Q8_0, 8 * 2 * 34)
        assert isinstance(fc1.raw, np.memmap) and not fc1.raw.flags.writeable
        expected = quants.dequantize(quants.quantize(tensors["blocks.0.mlp.fc1.weight"][0], Q.Q8_0), Q.Q8_0)
        assert torch.equal(dequantize_tensor(fc1), torch.from_numpy(expected))
        patch = f.tensors["video_patch_proj.weight"]
        assert patch.shape == (6, 2, 2) and patch.ggml_shape == (4, 6)  # orig_shape applied
        assert torch.equal(dequantize_tensor(patch).reshape(6, 4),
                           torch.from_numpy(tensors["video_patch_proj.weight"][0]))
        assert f.tensors["norm.weight"].qtype == Q.F16


def _tensor_info_offset(data: bytes, name: str) -> int:
    """Byte offset of the n_dims field of tensor `name`'s info entry."""
    encoded = name.encode()
    at = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return at + 8 + len(encoded)


def _patched(tmp_path, source, edit):
    data = bytearray(source.read_bytes())
    edit(data)
    out = tmp_path / "bad.gguf"
    out.write_bytes(bytes(data))
    return out


def _set_type(name, code):
    def edit(data):
        at = _tensor_info_offset(bytes(data), name)
        n_dims = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<I", data, at + 4 + 8 * n_dims, code)
    return edit


def _set_offset(name, value):
    def edit(data):
        at = _tensor_info_offset(bytes(data), name)
        n_dims = struct.unpack_from("<I", data, at)[0]
        struct.pack_into("<Q", data, at + 4 + 8 * n_dims + 4, value)
    return edit


def _set_dim0(name, value):
    def edit(data):
        struct.pack_into("<Q", data, _tensor_info_offset(bytes(data), name) + 4, value)
    return edit


BAD_CASES = {
    "bad magic": (lambda d: d.__setitem__(slice(0, 4), b"GGUX"), "magic b'GGUX'"),
    "version": (lambda d: struct.pack_into("<I", d, 4, 7), "version 7 is not supported"),
    "big-endian": (lambda d: struct.pack_into(">I", d, 4, 3), "big-endian"),
    "tensor count beyond the file": (lambda d: struct.pack_into("<Q", d, 8, 10**6), "more than the"),
    "tensor count absurd": (lambda d: struct.pack_into("<Q", d, 8, 2**63), "more than the limit"),
    "kv count beyond the file": (lambda d: struct.pack_into("<Q", d, 16, 2**40), "metadata entries"),
    "key length absurd": (lambda d: struct.pack_into("<Q", d, 24, 2**62), "more than the limit"),
    "unknown quant type": (_set_type("blocks.0.mlp.fc1.weight", 99), "unknown quantisation type 99"),
    "offset beyond the end": (_set_offset("norm.weight", 1 << 40), "runs past the end|more than the"),
    "misaligned offset": (_set_offset("norm.weight", 33), "not a multiple of the alignment"),
    "overlapping tensors": (_set_offset("blocks.0.attn.qkv_proj.weight", 0), "overlap"),
    "byte size past the data": (_set_dim0("blocks.0.mlp.fc1.weight", 1 << 20), "more than the|runs past"),
    "partial block row": (_set_dim0("blocks.0.mlp.fc1.weight", 48), "not a multiple of the 32-value block"),
    "zero dimension": (_set_dim0("norm.weight", 0), "has a zero dimension"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_malformed_headers_are_refused_naming_the_file(tmp_path, small_gguf, case):
    edit, message = BAD_CASES[case]
    bad = _patched(tmp_path, small_gguf[0], edit)
    with pytest.raises(InvalidInputError, match=message) as info:
        open_gguf(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_truncated_files_are_refused_at_every_length(tmp_path, small_gguf):
    data = small_gguf[0].read_bytes()
    with open_gguf(small_gguf[0]) as f:
        end = max(t.offset + t.nbytes for t in f.tensors.values())  # the writer pads after the last tensor
    for cut in (0, 3, 23, 40, len(data) // 2, end - 1):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(InvalidInputError, match="truncated|not a GGUF|runs past|more than"):
            open_gguf(path)


def test_metadata_limit_and_bad_orig_shape(tmp_path):
    rng = np.random.default_rng(0)
    big = write_gguf(tmp_path / "meta.gguf", {"w": (rng.standard_normal((2, 32)).astype(np.float32), "F32")},
                     extra={"blob": "x" * 5000})
    with pytest.raises(InvalidInputError, match="string of 5000 bytes, past the metadata limit of 1000 bytes"):
        open_gguf(big, max_metadata_bytes=1000)
    assert open_gguf(big).metadata["blob"] == "x" * 5000
    bad = write_gguf(tmp_path / "shape.gguf", {"w": (rng.standard_normal((2, 32)).astype(np.float32), "F32")},
                     extra={"comfy.gguf.orig_shape.w": [3, 32]})
    with pytest.raises(InvalidInputError, match="has 96 elements but the tensor"):
        open_gguf(bad)
    with pytest.raises(InvalidInputError, match="is not a file"):
        open_gguf(tmp_path / "missing.gguf")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_fuzzed_headers_only_open_or_raise_invalid_input(tmp_path_factory, edits, cut):
    source = _FUZZ_SOURCE.get("path")
    if source is None:
        folder = tmp_path_factory.mktemp("fuzz")
        rng = np.random.default_rng(5)
        source = write_gguf(folder / "seed.gguf", {
            "a.weight": (rng.standard_normal((2, 32)).astype(np.float32), "Q8_0"),
            "b.weight": (rng.standard_normal((1, 256)).astype(np.float32), "F16"),
        }, extra={"comfy.gguf.orig_shape.b.weight": [16, 16], "k": 5})
        _FUZZ_SOURCE["path"] = source
    data = bytearray(source.read_bytes())
    header = data.index(b"b.weight", data.index(b"b.weight") + 1) + 40  # through the tensor table
    for position, value in edits:
        data[position % header] = value
    if cut is not None:
        data = data[:cut % (len(data) + 1)]
    path = source.with_name("fuzzed.gguf")
    path.write_bytes(bytes(data))
    try:
        f = open_gguf(path)
    except InvalidInputError as exc:
        assert str(path) in str(exc)
        return
    for info in f.tensors.values():  # what opened must also decode (or refuse the type) without crashing
        try:
            dequantize_tensor(info)
        except InvalidInputError:
            pass
    f.close()


_FUZZ_SOURCE: dict = {}


# ---------------------------------------------------------------------------------------------- keys

COMFY_DIT = ["video_patch_proj.weight", "audio_patch_proj.weight", "condition_proj.weight", "blocks.0.attn.qkv_proj.weight",
             "blocks.1.mlp.fc1.weight", "blocks.0.attn.q_norm.weight", "final_layer.video_out.weight",
             "time_embedder.proj_in.weight", "rope.inv_freq"]


def test_detect_h3_styles_curve_form_and_wan_label():
    found = detect_h3(COMFY_DIT, "minimax_h3")
    assert (found.kind, found.key_style, found.curve_form, found.prefix) == ("dit", "comfy", False, "")
    assert "2 blocks" in found.reason
    pruned = [n for n in COMFY_DIT if not n.startswith("time_embedder")] + ["adaln_t_table"]
    assert detect_h3(pruned, "wan").curve_form
    prefixed = detect_h3(["model.diffusion_model." + n for n in COMFY_DIT])
    assert prefixed.prefix == "model.diffusion_model."
    diff = detect_h3(["proj_in.weight", "audio_proj_in.weight", "transformer_blocks.0.attn.to_q.weight"])
    assert diff.key_style == "diffusers"
    with pytest.raises(InvalidInputError, match="architecture 'flux' is not MiniMax H3"):
        detect_h3(COMFY_DIT, "flux")
    with pytest.raises(InvalidInputError, match="not a MiniMax H3 DiT .*'wan'.*patch_embedding"):
        detect_h3(["patch_embedding.weight", "blocks.0.self_attn.q.weight"], "wan")


def test_high_precision_names_and_component_split():
    for name in ("video_patch_proj.weight", "model.diffusion_model.adaln_t_table", "time_embedder.proj_in.weight",
                 "final_layer.video_out.weight", "blocks.3.attn.q_norm.weight", "transformer_blocks.0.norm1.weight",
                 "proj_out.bias", "norm_out.linear.weight"):
        assert is_high_precision(name), name
    for name in ("blocks.3.mlp.fc1.weight", "blocks.0.attn.qkv_proj.weight", "condition_proj.weight",
                 "transformer_blocks.0.ff.net.0.proj.weight", "blocks.0.adaln_proj.linear.weight"):
        assert not is_high_precision(name), name
    names = ["model.diffusion_model." + n for n in COMFY_DIT] + ["vae.decoder.conv.weight", "audio_vae.x.weight",
                                                                 "text_encoders.qwen3vl_32b.transformer.w", "odd"]
    groups = split_components(names)
    assert {k: len(v) for k, v in groups.items()} == {"dit": len(COMFY_DIT), "vae": 1, "audio-vae": 1,
                                                       "text-encoder": 1, "other": 1}
    assert split_components(COMFY_DIT) == {"dit": COMFY_DIT}
    assert split_components(["decoder.a.weight", "encoder.b.weight"]) == {"vae": ["decoder.a.weight",
                                                                                   "encoder.b.weight"]}
