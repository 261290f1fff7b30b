"""Streaming tiled upscaling (h3director.video.upscale) with plain torch convolutional nets: exact seams with auto
overlap, visible seams without the centre crop, receptive field derived vs measured, OOM halving one tile, resume of
a .npy, audio copied unchanged into the MP4, bad input refused before any output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from comfy_harness.upscale_media import audio_payloads, decode_rgb, video_with_audio
from torch import nn

from h3director.errors import InvalidInputError
from h3director.video.sinks import file_sink_for
from h3director.video.sinks.memmap import MemmapSink
from h3director.video.upscale import OomOnTile, TiledUpscaler, UpscaleModel, resolve_overlap, stream_upscale
from h3director.video.upscale_field import derive_field, measure_field
from h3director.video.upscale_sources import ArraySource, npy_source, open_source
from h3director.video.upscale_tiles import plan_tiles, split_tile


class ConvUpscaler(nn.Module):
    """A small residual conv net with pixel-shuffle upsampling and a nearest-upsampled skip (SRVGG-like)."""

    def __init__(self, scale: int = 2, features: int = 8, body: int = 3) -> None:
        super().__init__()
        self.scale = scale
        self.first = nn.Conv2d(3, features, 3, padding=1)
        layers: list[nn.Module] = []
        for _ in range(body):
            layers += [nn.Conv2d(features, features, 3, padding=1), nn.LeakyReLU(0.2)]
        self.body = nn.Sequential(*layers)
        self.up = nn.Sequential(nn.Conv2d(features, 3 * scale * scale, 3, padding=1), nn.PixelShuffle(scale))
        self.skip = nn.Upsample(scale_factor=scale, mode="nearest")

    def forward(self, x):
        features = self.first(x)
        return torch.sigmoid(self.up(features + self.body(features)) + self.skip(x))


class DilatedUpscaler(nn.Module):
    """Dilated and 5x5 convolutions, upsampling in the middle: the derivation must convert reach per layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 6, 5, padding=2)
        self.b = nn.Conv2d(6, 6, 3, padding=2, dilation=2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.c = nn.Conv2d(6, 6, 3, padding=1)
        self.d = nn.Conv2d(6, 3, 5, padding=2)

    def forward(self, x):
        return torch.sigmoid(self.d(torch.relu(self.c(self.up(torch.relu(self.b(torch.relu(self.a(x)))))))))


class GlobalUpscaler(ConvUpscaler):
    """Adds a global mean (like channel attention): not convolutional, tiles cannot be exact."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return super().forward(x) * (0.5 + self.pool(x))


def _model(net: nn.Module, scale: int = 2) -> UpscaleModel:
    torch.manual_seed(0)
    net = net.eval()
    # default init; outputs stay in [0, 1] (a final sigmoid) as an upscaler's do, so 1e-5 is float rounding
    return UpscaleModel.from_module(net, scale)


def _untiled(model: UpscaleModel, frame: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.call(frame[None])[0]


@pytest.fixture
def conv_model() -> UpscaleModel:
    return _model(ConvUpscaler())


def test_auto_overlap_is_exact_and_no_crop_shows_seams(conv_model):
    frame = torch.rand(3, 70, 90, generator=torch.Generator().manual_seed(1))
    reference = _untiled(conv_model, frame)
    overlap, where, exact = resolve_overlap(conv_model, "auto")
    assert (overlap, where, exact) == (conv_model.receptive_field, "derived", True)
    tiled = TiledUpscaler(conv_model, 70, 90, 2 * overlap + 12, overlap, exact)
    assert len(tiled.plan) > 4
    assert (tiled.upscale(0, frame) - reference).abs().max().item() <= 1e-5
    # without the centre crop: no context (overlap 0), and the feathered blend at the same overlap
    seams_cut = TiledUpscaler(conv_model, 70, 90, 2 * overlap + 12, 0, False).upscale(0, frame)
    seams_feather = TiledUpscaler(conv_model, 70, 90, 2 * overlap + 12, overlap, False).upscale(0, frame)
    assert (seams_cut - reference).abs().max().item() > 1e-2
    assert (seams_feather - reference).abs().max().item() > 1e-3


def test_overlap_below_the_field_is_not_exact(conv_model):
    frame = torch.rand(3, 60, 60, generator=torch.Generator().manual_seed(2))
    overlap, _, exact = resolve_overlap(conv_model, conv_model.receptive_field - 4)
    assert not exact
    out = TiledUpscaler(conv_model, 60, 60, 2 * overlap + 10, overlap, True).upscale(0, frame)  # forced crop
    assert (out - _untiled(conv_model, frame)).abs().max().item() > 1e-4


@pytest.mark.parametrize("net, scale", [(ConvUpscaler(), 2), (ConvUpscaler(scale=3, body=5), 3), (DilatedUpscaler(), 2)])
def test_derived_field_bounds_the_measured_one(net, scale):
    model = _model(net, scale)
    measured = measure_field(model.call, scale)
    assert model.convolutional and model.receptive_field is not None
    assert measured >= 1
    assert measured <= model.receptive_field <= measured + 3
    frame = torch.rand(3, 64, 80, generator=torch.Generator().manual_seed(3))
    out = TiledUpscaler(model, 64, 80, 2 * model.receptive_field + 8, model.receptive_field, True).upscale(0, frame)
    assert (out - _untiled(model, frame)).abs().max().item() <= 1e-5


def test_dilated_field_value():
    # a: 5x5 (2) + b: dilation 2 (2) at input scale; c (1) and d (2) after 2x upsampling: 1.5 px; + 1 scale change
    assert derive_field(DilatedUpscaler().eval()).radius == 2 + 2 + 2 + 1


def test_global_ops_are_not_convolutional_and_get_the_feathered_blend(tmp_path):
    model = _model(GlobalUpscaler())
    assert not model.convolutional and model.receptive_field is None
    frames = np.random.default_rng(0).integers(0, 256, (2, 40, 48, 3), dtype=np.uint8)
    report = stream_upscale(model, ArraySource(frames), MemmapSink(tmp_path / "g.npy"), tile=32, overlap="auto")
    assert not report.exact and "not exact" in "\n".join(report.lines())
    assert report.overlap_source.startswith("feather") and report.overlap == 32 // 8


def test_unknown_field_of_a_convolutional_call_is_measured(conv_model):
    model = UpscaleModel(conv_model.call, 2, convolutional=True, name="opaque")
    overlap, where, exact = resolve_overlap(model, "auto")
    assert where.startswith("measured") and exact
    assert model.receptive_field == measure_field(conv_model.call, 2) and overlap >= model.receptive_field + 2
    frame = torch.rand(3, 48, 60, generator=torch.Generator().manual_seed(5))
    out = TiledUpscaler(model, 48, 60, 2 * overlap + 8, overlap, exact).upscale(0, frame)
    assert (out - _untiled(model, frame)).abs().max().item() <= 1e-5


def test_stream_to_npy_equals_untiled(conv_model, tmp_path):
    frames = np.random.default_rng(1).integers(0, 256, (3, 50, 66, 3), dtype=np.uint8)
    report = stream_upscale(conv_model, ArraySource(frames), file_sink_for(tmp_path / "out.npy"), tile=32)
    out = np.load(report.result)
    assert out.shape == (3, 100, 132, 3) and out.dtype == np.uint8
    assert report.exact and report.tiles == 3 * report.tiles_per_frame > 3
    for index in range(3):
        reference = _untiled(conv_model, torch.from_numpy(frames[index]).permute(2, 0, 1).float() / 255)
        expected = (reference.clamp(0, 1) * 255).round().permute(1, 2, 0).numpy().astype(np.uint8)
        assert np.abs(out[index].astype(int) - expected.astype(int)).max() <= 1


def test_oom_on_one_tile_halves_only_that_tile(conv_model, tmp_path):
    frames = np.random.default_rng(2).integers(0, 256, (3, 50, 66, 3), dtype=np.uint8)
    clean = stream_upscale(conv_model, ArraySource(frames), MemmapSink(tmp_path / "a.npy"), tile=32)
    fault = OomOnTile(frame=1, tile=2)
    report = stream_upscale(conv_model, ArraySource(frames), MemmapSink(tmp_path / "b.npy"), tile=32, fault=fault)
    assert len(fault.hits) == 1 and len(report.halvings) == 1
    halving = report.halvings[0]
    assert (halving.frame, halving.tile, len(halving.into)) == (1, 2, 4)
    per_frame = clean.tiles_per_frame
    # frame 0: the plan; frames 1 and 2: the plan with tile 2 replaced by its 4 halves (the failed try is not counted)
    assert report.tiles == per_frame + 2 * (per_frame + 3)
    assert np.array_equal(np.load(report.result), np.load(clean.result))


def test_split_tile_keeps_the_overlap():
    tiles = plan_tiles(100, 100, 40, 8)
    parts = split_tile(tiles[4], 100, 100, 8)
    assert len(parts) == 4
    covered = sorted(p.core for p in parts)
    top, bottom, left, right = tiles[4].core
    assert covered[0][0] == top and covered[-1][1] == bottom and covered[0][2] == left and covered[-1][3] == right
    for part in parts:
        assert part.region[0] == max(0, part.core[0] - 8) and part.region[3] == min(100, part.core[3] + 8)


class _Interrupt(Exception):
    pass


def test_resume_npy_does_not_redo_finished_frames(conv_model, tmp_path):
    frames = np.random.default_rng(3).integers(0, 256, (5, 40, 40, 3), dtype=np.uint8)
    out = tmp_path / "r.npy"

    def kill_after_three(done, total):
        if done == 3:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        stream_upscale(conv_model, ArraySource(frames, identity="same"), MemmapSink(out, resume=True, job="j"),
                       tile=32, on_frame=kill_after_three)
    assert not out.exists()
    seen: list[int] = []

    class Counting(ArraySource):
        def frames(self, start=0):
            for index, frame in enumerate(super().frames(start), start):
                seen.append(index)
                yield frame

    report = stream_upscale(conv_model, Counting(frames, identity="same"), MemmapSink(out, resume=True, job="j"),
                            tile=32)
    assert report.resumed_from == 3 and seen == [3, 4]
    fresh = stream_upscale(conv_model, ArraySource(frames), MemmapSink(tmp_path / "f.npy"), tile=32)
    assert np.array_equal(np.load(out), np.load(fresh.result))


def test_video_file_in_mp4_out_audio_copied_unchanged(conv_model, tmp_path):
    from h3director.video.upscale_audio import AudioCopyVideoSink

    frames = np.random.default_rng(4).integers(0, 256, (6, 32, 48, 3), dtype=np.uint8)
    source_path = tmp_path / "in.mp4"
    video_with_audio(source_path, frames)
    source = open_source(source_path)
    assert (source.count, source.height, source.width, source.fps) == (6, 32, 48, 12.0)
    assert source.audio_path == source_path
    sink = AudioCopyVideoSink(tmp_path / "out.mp4", source.audio_path, crf=0)
    report = stream_upscale(conv_model, source, sink, tile=24)
    assert report.audio and "unchanged" in report.audio
    assert audio_payloads(report.result) == audio_payloads(source_path)
    assert decode_rgb(report.result).shape == (6, 64, 96, 3)


def test_bad_inputs_refused_before_output(conv_model, tmp_path):
    frames = np.zeros((2, 64, 64, 3), np.uint8)
    out = tmp_path / "o.npy"
    with pytest.raises(InvalidInputError, match="larger than 2 x overlap"):
        stream_upscale(conv_model, ArraySource(frames), MemmapSink(out), tile=2 * conv_model.receptive_field)
    with pytest.raises(InvalidInputError, match="overlap"):
        stream_upscale(conv_model, ArraySource(frames), MemmapSink(out), overlap="wide")
    assert not out.exists() and not list(tmp_path.iterdir())
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 8, 8, 3), np.int16))
    with pytest.raises(InvalidInputError, match="dtype int16"):
        npy_source(bad)
    np.save(bad, np.zeros((2, 8, 8), np.uint8))
    with pytest.raises(InvalidInputError, match=r"\[F, H, W, 3\]"):
        npy_source(bad)
    with pytest.raises(InvalidInputError, match="no such file"):
        open_source(tmp_path / "missing.mp4")
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    with pytest.raises(InvalidInputError):
        open_source(tmp_path / "junk.mp4")


def test_missing_spandrel_names_the_extra(monkeypatch):
    import sys

    from h3director.integrations.spandrel_models import load_upscale_model

    monkeypatch.setitem(sys.modules, "spandrel", None)   # import spandrel -> ImportError
    monkeypatch.delitem(sys.modules, "folder_paths", raising=False)   # library use, whatever earlier tests imported
    model = __file__  # an existing file: the check for spandrel comes next
    with pytest.raises(InvalidInputError, match=r"h3director\[upscale\].*torchvision"):
        load_upscale_model(model)


def test_frame_that_fits_one_tile_ignores_an_overlap_wider_than_the_tile(conv_model, tmp_path):
    # a receptive field wider than the tile does not matter when the whole frame is one tile (as prepare() says)
    frames = np.random.default_rng(6).integers(0, 256, (2, 12, 14, 3), dtype=np.uint8)
    tile = 14
    assert 2 * conv_model.receptive_field + 1 > tile
    report = stream_upscale(conv_model, ArraySource(frames), MemmapSink(tmp_path / "one.npy"), tile=tile)
    assert report.exact and report.tiles_per_frame == 1 and report.tiles == 2
    reference = _untiled(conv_model, torch.from_numpy(frames[1]).permute(2, 0, 1).float() / 255)
    expected = (reference.clamp(0, 1) * 255).round().permute(1, 2, 0).numpy().astype(int)
    assert np.abs(np.load(report.result)[1].astype(int) - expected).max() <= 1


def test_resume_key_names_the_weights_not_only_the_architecture():
    # a resumed .npy must not continue another model's partial output: same architecture, other weights
    from h3director.video.upscale import job_key

    source = ArraySource(np.zeros((2, 8, 8, 3), np.uint8), identity="same")

    def seeded() -> UpscaleModel:
        torch.manual_seed(7)
        return _model(ConvUpscaler())

    first, second = seeded(), seeded()
    assert job_key(first, source, 32, 8, True) == job_key(second, source, 32, 8, True)
    with torch.no_grad():
        second.module.first.bias.add_(0.25)
    assert first.name == second.name
    assert job_key(first, source, 32, 8, True) != job_key(second, source, 32, 8, True)


@pytest.mark.parametrize("alignment", [1, 2, 4])
def test_regions_never_exceed_the_tile(alignment):
    # every region <= tile on each side, cores aligned and covering each row once, whatever the length
    for tile in (4 * alignment, 5 * alignment + 1, 40):
        for overlap in range(0, tile // 2 - alignment + 1, alignment):
            for length in range(tile + 1, 6 * tile):
                plan = plan_tiles(length, 1, tile, overlap, alignment)
                cores = [t.core[:2] for t in plan]
                assert cores[0][0] == 0 and cores[-1][1] == length
                assert all(a[1] == b[0] for a, b in zip(cores[:-1], cores[1:], strict=True))
                assert all(t.core[0] % alignment == 0 for t in plan)
                assert max(t.region_size[0] for t in plan) <= tile, (tile, overlap, length, plan)


class FunctionalGlobalUpscaler(ConvUpscaler):
    """A global mean taken in forward (no pooling layer for the derivation to see): not convolutional."""

    def forward(self, x):
        return super().forward(x) * (0.5 + x.mean((2, 3), keepdim=True))


def test_global_op_outside_any_layer_is_not_called_exact(tmp_path):
    model = _model(FunctionalGlobalUpscaler())
    assert not model.convolutional and model.receptive_field is None
    frames = np.random.default_rng(8).integers(0, 256, (1, 40, 48, 3), dtype=np.uint8)
    report = stream_upscale(model, ArraySource(frames), MemmapSink(tmp_path / "f.npy"), tile=32)
    assert not report.exact and "not exact" in "\n".join(report.lines())
