"""The upscale recipe stages with plain torch convolutional nets: pre-resize and post-resize (Pillow, deterministic),
tile batches, float16 against float32 with the measured difference, per-stage report, and the refusals that come
before any frame is read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_upscale import ConvUpscaler

from h3director.errors import InvalidInputError
from h3director.video.resize import parse_size, resize_frame
from h3director.video.sinks.memmap import MemmapSink
from h3director.video.upscale import OomOnTile, Recipe, UpscaleModel, check_dtype_runs, stream_upscale
from h3director.video.upscale_sources import ArraySource
from h3director.video.upscale_stages import dtype_refusal


class CountingSource(ArraySource):
    """An `ArraySource` that counts the frames read from it."""

    def __init__(self, array) -> None:
        super().__init__(array)
        self.reads = 0

    def frames(self, start: int = 0):
        for frame in super().frames(start):
            self.reads += 1
            yield frame


def _frames(count: int = 2, height: int = 40, width: int = 56, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return ConvUpscaler(2).eval()


def _run(tmp_path, name: str, model: UpscaleModel, frames: np.ndarray, **kwargs):
    sink = MemmapSink(tmp_path / f"{name}.npy", dtype="float32")
    report = stream_upscale(model, ArraySource(frames), sink, **kwargs)
    return report, np.load(tmp_path / f"{name}.npy")


def test_resize_is_deterministic_and_area_is_the_block_mean():
    frame = torch.rand(3, 36, 52, generator=torch.Generator().manual_seed(1))
    for name in ("lanczos", "area", "bicubic"):
        first, second = resize_frame(frame, (18, 26), name), resize_frame(frame, (18, 26), name)
        assert first.shape == (3, 18, 26) and first.dtype == torch.float32
        assert torch.equal(first, second), name
    blocks = frame.reshape(3, 18, 2, 26, 2).mean((2, 4))
    torch.testing.assert_close(resize_frame(frame, (18, 26), "area"), blocks, rtol=0, atol=1e-6)
    lanczos = resize_frame(frame, (72, 104), "lanczos")
    assert lanczos.min() >= 0 and lanczos.max() <= 1
    assert not torch.equal(lanczos, resize_frame(frame, (72, 104), "bicubic"))


@pytest.mark.parametrize(("text", "message"), [
    ("0x1080", "positive and even"), ("1921x1080", "positive and even"), ("1920x-2", "positive and even"),
    ("1920", "WIDTHxHEIGHT"), ("wide", "WIDTHxHEIGHT")])
def test_sizes_that_are_not_positive_and_even_are_refused(text, message):
    with pytest.raises(InvalidInputError, match=message):
        parse_size(text, "--post-resize")


def test_recipe_refusals():
    assert Recipe.build(pre_resize="1920x1080", post_resize="3840x2160").pre_resize == (1080, 1920)
    with pytest.raises(InvalidInputError, match="'nearest' is not a resampling filter"):
        Recipe.build(post_resize="64x64", resample="nearest")
    with pytest.raises(InvalidInputError, match="--resample applies to --post-resize"):
        Recipe.build(resample="lanczos")
    with pytest.raises(InvalidInputError, match="--pre-resample applies to --pre-resize"):
        Recipe.build(pre_resample="area")
    for batch in (0, "-1", "two", "1.5"):
        with pytest.raises(InvalidInputError, match="--tile-batch"):
            Recipe.build(tile_batch=batch)


def test_bad_recipe_is_refused_before_any_frame_is_read(tmp_path):
    model = UpscaleModel.from_module(_net(), 2)
    source = CountingSource(_frames())
    target = tmp_path / "never.npy"
    with pytest.raises(InvalidInputError, match="larger than 2 x overlap"):
        # 40x56 -> 80x112 before the model: tile 10 cannot hold the derived overlap
        stream_upscale(model, source, MemmapSink(target), tile=10, recipe=Recipe.build(pre_resize="112x80"))
    assert source.reads == 0 and not target.exists()
    # the tiling is checked at the size the model sees: 8x8 fits one tile of 10
    report = stream_upscale(model, source, MemmapSink(target), tile=10, recipe=Recipe.build(pre_resize="8x8"))
    assert report.tiles_per_frame == 1 and report.output_size == (16, 16) and source.reads == 2


def test_pre_and_post_resize_equal_the_same_steps_by_hand(tmp_path):
    model = UpscaleModel.from_module(_net(), 2)
    frames = _frames(2, 40, 56)
    recipe = Recipe.build(pre_resize="28x20", post_resize="56x40")
    report, got = _run(tmp_path, "recipe", model, frames, tile=16, recipe=recipe)
    assert got.shape == (2, 40, 56, 3)
    assert report.model_size == (20, 28) and report.output_size == (40, 56) and report.tiles_per_frame > 1
    assert report.exact
    for index, frame in enumerate(frames):
        image = torch.from_numpy(frame).permute(2, 0, 1).float() / 255
        small = resize_frame(image, (20, 28), "area")
        with torch.inference_mode():
            restored = model.call(small[None])[0]
        expected = resize_frame(restored, (40, 56), "lanczos").permute(1, 2, 0).numpy()
        # tiles exact up to float rounding; then the same deterministic resize
        assert np.abs(got[index] - expected).max() < 1e-5
    names = [stage.name for stage in report.stages]
    assert names == ["read", "pre-resize", "model", "post-resize", "write"]
    assert all(stage.frames == 2 and stage.seconds > 0 for stage in report.stages)
    assert all(stage.peak_host_bytes and stage.peak_device_bytes is None for stage in report.stages)
    assert "deterministic" in report.stages[1].exactness and "Pillow" in report.stages[3].exactness
    assert report.peak_host_bytes >= max(stage.peak_host_bytes for stage in report.stages)
    text = "\n".join(report.lines())
    assert "pre-resize: 28x20 area" in text and "stage post-resize" in text


def test_tile_batch_matches_one_tile_at_a_time(tmp_path):
    model = UpscaleModel.from_module(_net(), 2)
    frames = _frames(2, 64, 96)
    single, one = _run(tmp_path, "one", model, frames, tile=32)
    batched, many = _run(tmp_path, "many", model, frames, tile=32, recipe=Recipe.build(tile_batch=4))
    assert single.tiles == batched.tiles and single.tiles_per_frame > 4
    assert batched.tile_batch == batched.tile_batch_used == 4
    # the same convolutions over a batch of N: equal up to float rounding
    assert np.abs(one - many).max() < 1e-5


def test_a_batch_out_of_memory_is_halved_then_the_tile(tmp_path):
    model = UpscaleModel.from_module(_net(), 2)
    frames = _frames(1, 64, 96)
    _, reference = _run(tmp_path, "ref", model, frames, tile=32)
    fault = OomOnTile(frame=0, tile=1, times=1)
    report, got = _run(tmp_path, "oom", model, frames, tile=32, fault=fault, recipe=Recipe.build(tile_batch=4))
    # batch of 4 -> 2 -> 1 (attempt 0 each time), then the tile itself is halved (attempt 0 -> 1)
    assert [(cut.before, cut.after) for cut in report.batch_cuts] == [(4, 2), (2, 1)]
    assert report.tile_batch_used == 1 and len(report.halvings) == 1 and report.halvings[0].tile == 1
    assert np.abs(got - reference).max() < 1e-5


def test_fp16_run_reports_its_measured_difference_from_fp32(tmp_path):
    frames = _frames(2, 40, 56)
    full = UpscaleModel.from_module(_net(), 2)
    half = UpscaleModel.from_module(_net(), 2, dtype=torch.float16)
    assert half.dtype == torch.float16 and half.reference is not None and half.reference.dtype == torch.float32
    ref_report, ref = _run(tmp_path, "fp32", full, frames, tile=24)
    report, got = _run(tmp_path, "fp16", half, frames, tile=24)
    assert ref_report.dtype_error is None and report.dtype == "fp16"
    error = report.dtype_error
    assert 0 < error["max_abs"] < 1e-2 and 0 < error["mean_abs"] <= error["max_abs"]
    difference = np.abs(got - ref).max()
    assert 0 < difference < 1e-2  # fp16 really ran, and stays close
    assert "approximate" in report.stages[1].exactness
    assert "fp16: approximate" in "\n".join(report.lines())


def test_a_gpu_without_the_dtype_is_refused_before_running(monkeypatch):
    """No GPU here: torch.cuda's own query functions answer as a Tesla K80 (compute capability 3.7, no float16
    arithmetic) and a T4 (7.5, no native bfloat16) would; nothing runs on the device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla K80")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (3, 7))
    assert "no float16" in dtype_refusal("cuda:0", torch.float16)
    with pytest.raises(InvalidInputError, match=r"--dtype fp16: cuda:0 \(Tesla K80, compute capability 3.7\)"):
        check_dtype_runs(lambda x: pytest.fail("must not run"), "net", torch.device("cuda:0"), torch.float16, 16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert dtype_refusal("cuda:0", torch.float16) is None
    assert "no native bfloat16" in dtype_refusal("cuda:0", torch.bfloat16)
    assert dtype_refusal("cpu", torch.float16) is None and dtype_refusal("cuda:0", torch.float32) is None
