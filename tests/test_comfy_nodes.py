"""Executes the pack's nodes with ComfyUI-shaped inputs (stand-ins from `fixtures/comfy_harness`).

The VAE objects mirror ComfyUI's `comfy.sd.VAE` around the real diffusers H3 VAEs (tiny random
configs); the reference for bit-identity here is `vae_decode_node`, core `VAEDecode`'s steps replayed
on the same stand-in VAE. Equality with the REAL core `VAEDecode` (same geometries) is checked in
`tests/test_comfy_real.py`.
"""

from __future__ import annotations

import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.errors import H3DirectorError, InvalidInputError

install_stubs()

from comfy_harness.fake_vae import comfy_audio_vae, comfy_video_vae, vae_decode_node  # noqa: E402


class Nested:
    """Mirrors `comfy.nested_tensor.NestedTensor` (`tensors`, `is_nested`)."""

    def __init__(self, tensors):
        self.tensors = list(tensors)
        self.is_nested = True


@pytest.fixture(scope="module")
def video_vae():
    return comfy_video_vae(seed=1)


def _decode_node():
    from h3director.comfy.nodes_decode import DecodeAVStreaming

    return DecodeAVStreaming


def _latent(t=7, h=16, w=24, seed=3):
    return torch.randn(1, 24, t, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_images_mode_is_bit_identical_to_vae_decode_on_the_stand_in(video_vae, output_dir):
    latent = {"samples": _latent(t=12, h=8, w=24)}  # 2 clips; 384 px wide = 2 spatial tiles
    reference = vae_decode_node(video_vae, latent)
    out = _decode_node().execute(latent, video_vae, "images", "video/x", 24.0, 18)
    images, audio, report = out.args
    assert audio is None
    assert images.dtype == torch.float32 and images.shape == reference.shape
    assert torch.equal(images, reference)
    assert "39 in 2 clips" in report


def test_single_latent_frame_matches_vae_decode_on_the_stand_in(video_vae, output_dir):
    latent = {"samples": _latent(t=1, h=8, w=8)}
    out = _decode_node().execute(latent, video_vae, "images", "video/x", 24.0, 18)
    assert torch.equal(out.args[0], vae_decode_node(video_vae, latent))


@pytest.mark.slow
def test_video_file_mode_writes_mp4_with_audio_in_output_folder(video_vae, output_dir):
    import av

    audio_vae = comfy_audio_vae(seed=2)
    video = _latent(t=7, h=8, w=8)
    audio = torch.randn(1, 32, 2, 12, generator=torch.Generator().manual_seed(5))
    latent = {"samples": Nested((video, audio))}
    out = _decode_node().execute(latent, video_vae, "video_file", "clips/h3", 24.0, 18, audio_vae=audio_vae)
    last, audio_out, report = out.args
    files = list((output_dir / "clips").iterdir())
    assert [f.name for f in files] == ["h3_00001_.mp4"]
    assert out.ui.as_dict() == {"images": [{"filename": "h3_00001_.mp4", "subfolder": "clips", "type": "output"}],
                                "animated": (True,)}
    reference = vae_decode_node(video_vae, {"samples": video})
    assert torch.equal(last, reference[-1:])
    with av.open(str(files[0])) as container:
        assert container.streams.video[0].frames == reference.shape[0]
        assert len(container.streams.audio) == 1
    assert audio_out["sample_rate"] == 32_000 and audio_out["waveform"].shape == (1, 2, 12 * 800)
    assert "saved:" in report


@pytest.mark.parametrize("output", ["video_file", "images"])
def test_av_latent_without_audio_vae_decodes_the_video_only(video_vae, output_dir, output):
    """Audio off: an AV latent and no audio_vae give the same frames as the video latent alone, no audio stream,
    audio output None, and the report says the audio was not decoded."""
    import av

    from h3director.comfy.nodes_decode import AUDIO_SKIPPED_NOTE

    video = _latent(t=7, h=8, w=8)
    audio = torch.randn(1, 32, 2, 12, generator=torch.Generator().manual_seed(5))
    out = _decode_node().execute({"samples": Nested((video, audio))}, video_vae, output, "videoonly/h3", 24.0, 18)
    images, audio_out, report = out.args
    reference = vae_decode_node(video_vae, {"samples": video})
    assert audio_out is None
    assert AUDIO_SKIPPED_NOTE in report.splitlines()
    if output == "images":
        assert torch.equal(images, reference)
        return
    assert torch.equal(images, reference[-1:])
    [path] = (output_dir / "videoonly").iterdir()
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == reference.shape[0]
        assert len(container.streams.audio) == 0


def test_bad_inputs_are_refused_before_decoding(video_vae, output_dir):
    node = _decode_node()
    with pytest.raises(InvalidInputError, match="image latent"):
        node.execute({"samples": torch.zeros(1, 4, 8, 8)}, video_vae, "images", "v", 24.0, 18)
    with pytest.raises(InvalidInputError, match="audio latent"):   # checked even when the audio is not decoded
        node.execute({"samples": Nested((_latent(3, 8, 8), torch.zeros(1, 32, 3, 10)))}, video_vae,
                     "video_file", "v", 24.0, 18)
    with pytest.raises(InvalidInputError, match="NaN"):
        node.execute({"samples": torch.full((1, 24, 3, 8, 8), float("nan"))}, video_vae, "images", "v", 24.0, 18)
    audio_vae = comfy_audio_vae(seed=2)
    with pytest.raises(InvalidInputError, match="unsupported VAE"):
        node.execute({"samples": _latent(3, 8, 8)}, audio_vae, "images", "v", 24.0, 18)
    with pytest.raises(H3DirectorError):
        node.execute({"samples": _latent(3, 8, 8)}, video_vae, "video_file", "../escape/v", 24.0, 18)
    assert list(output_dir.iterdir()) == []
    assert not list(output_dir.parent.glob("escape*"))


def test_frame_offset_moves_the_picture_against_the_untouched_sound():
    from h3director.comfy.nodes_frames import FrameOffset

    images = torch.arange(5, dtype=torch.float32).view(5, 1, 1, 1).expand(5, 2, 2, 3).contiguous()
    wave = torch.arange(1, 11, dtype=torch.float32).view(1, 1, 10)
    out_images, out_audio = FrameOffset.execute(images, 2, 5.0, audio={"waveform": wave, "sample_rate": 10}).args
    assert out_images[:, 0, 0, 0].tolist() == [0, 0, 0, 1, 2]      # picture later: the first frame repeats
    assert torch.equal(out_audio["waveform"], wave)                  # the sound is not moved
    back, _ = FrameOffset.execute(images, -2, 24.0).args
    assert back[:, 0, 0, 0].tolist() == [2, 3, 4, 4, 4]             # picture earlier: the last frame repeats


def test_frame_offset_moves_the_sound_against_the_untouched_picture():
    from h3director.comfy.nodes_frames import FrameOffset

    images = torch.rand(4, 2, 2, 3)
    wave = torch.arange(1, 11, dtype=torch.float32).view(1, 1, 10)
    audio = {"waveform": wave, "sample_rate": 10}
    out_images, later = FrameOffset.execute(images, 0, 24.0, audio=audio, audio_ms=300.0).args
    assert torch.equal(out_images, images)
    assert later["waveform"].flatten().tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7]   # silence in front
    _, earlier = FrameOffset.execute(images, 0, 24.0, audio=audio, audio_ms=-140.0).args   # 1.4 -> 1 sample
    assert earlier["waveform"].flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10, 0]  # silence at the end


def test_frame_offset_refuses_bad_input():
    from h3director.comfy.nodes_frames import FrameOffset

    wave = {"waveform": torch.zeros(1, 1, 10), "sample_rate": 10}
    with pytest.raises(InvalidInputError):
        FrameOffset.execute(torch.zeros(2, 2, 3), 1, 24.0)
    with pytest.raises(InvalidInputError, match="beyond the clip"):
        FrameOffset.execute(torch.zeros(3, 2, 2, 3), 3, 24.0)
    with pytest.raises(InvalidInputError, match="beyond the sound"):
        FrameOffset.execute(torch.zeros(3, 2, 2, 3), 0, 24.0, audio=wave, audio_ms=1000.0)
    with pytest.raises(InvalidInputError, match="no audio"):
        FrameOffset.execute(torch.zeros(3, 2, 2, 3), 0, 24.0, audio_ms=5.0)


def test_av_sync_measure_node_reads_the_offset_and_plots_both_envelopes():
    from synthetic_av import synthetic_tracks

    from h3director.comfy.nodes_avsync import AVSyncMeasure
    from h3director.comfy.nodes_frames import FrameOffset

    frames, samples = synthetic_tracks("flash", 80.0, seconds=6.0, size=(64, 48), seed=4)
    images = torch.from_numpy(frames).float() / 255.0
    audio = {"waveform": torch.from_numpy(samples).view(1, 1, -1), "sample_rate": 32000}
    offset, confidence, plot, text = AVSyncMeasure.execute(images, audio, 24.0).args
    assert abs(offset - 80.0) <= 10.0 and confidence >= 0.25 and "audio late" in text
    assert plot.ndim == 4 and plot.shape[0] == 1 and plot.shape[-1] == 3 and plot.dtype == torch.float32
    assert 0 <= float(plot.min()) and float(plot.max()) <= 1 and float(plot.std()) > 0
    _, fixed = FrameOffset.execute(images, 0, 24.0, audio=audio, audio_ms=-offset).args   # the seed's correction
    assert abs(AVSyncMeasure.execute(images, fixed, 24.0).args[0]) <= 10.0
    still, quiet = synthetic_tracks("none", 0.0, seconds=3.0, size=(64, 48))
    result = AVSyncMeasure.execute(torch.from_numpy(still).float() / 255.0,
                                   {"waveform": torch.from_numpy(quiet).view(1, 1, -1), "sample_rate": 32000}, 24.0)
    assert result.args[:2] == (0.0, 0.0) and result.args[3].startswith("no usable events")
    with pytest.raises(InvalidInputError, match="AUDIO"):
        AVSyncMeasure.execute(images, {"waveform": torch.zeros(3)}, 24.0)


def _wait_for_samples(monitor, count: int, timeout_s: float = 60.0) -> None:
    """Block until the sampler thread has taken `count` more samples (not a sleep: load does not matter)."""
    import time

    target = monitor.report().overhead["sampler_samples"] + count
    deadline = time.monotonic() + timeout_s
    while monitor.report().overhead["sampler_samples"] < target:
        assert time.monotonic() < deadline, f"the sampler took fewer than {count} samples in {timeout_s} s"
        time.sleep(0.005)


def test_monitor_start_stop_returns_plot_image_and_summary(output_dir):
    import numpy as np

    from h3director.comfy import live
    from h3director.comfy.nodes_monitor import MonitorStart, MonitorStop, report_image
    from h3director.units import MiB, format_size

    handle, passthrough = MonitorStart.execute(20, "test", trigger="x").args
    assert passthrough == "x"
    monitor = live._active[handle.monitor_id]
    _wait_for_samples(monitor, 3)
    baseline = monitor.report().peaks["host.rss_bytes"]
    buffer = np.ones(300 * MiB, dtype=np.uint8)                 # np.ones touches every page: resident
    _wait_for_samples(monitor, 5)
    del buffer
    image, summary = MonitorStop.execute(handle, trigger=None).args
    report = live._last_report                                  # the report the Stop node just made
    assert report.metadata == {"label": "test"}
    peak = report.peaks["host.rss_bytes"]
    assert abs((peak - baseline) - 300 * MiB) <= 0.15 * 300 * MiB, (peak - baseline) / MiB
    whole_run = summary.splitlines()[2]                          # header, rule, then "(whole run)"
    assert whole_run.startswith("(whole run)") and format_size(peak) in whole_run
    assert image.ndim == 4 and image.shape[0] == 1 and image.shape[-1] == 3
    assert image.dtype == torch.float32 and 0 <= float(image.min()) and float(image.max()) <= 1
    assert torch.equal(image, report_image(report, "H3 Director: test"))   # the IMAGE is this report's timeline
    with pytest.raises(InvalidInputError, match="not running"):
        MonitorStop.execute(handle)


def test_guard_wrapper_preflights_each_forward_with_the_capacity_cost_model():
    from comfy.patcher_extension import WrapperExecutor

    from h3director.comfy.nodes_guard import forward_tokens, make_guard_wrapper
    from h3director.dit.capacity import ledger_cost_model
    from h3director.dit.tiers import STOCK

    cost = ledger_cost_model(framework="comfy")
    one_block = cost(STOCK, 4, "bf16")

    class RecordingGuard:
        def __init__(self):
            self.seen = []

        def preflight(self, nbytes, what):
            self.seen.append(nbytes)
            if nbytes > 10 * one_block:
                raise H3DirectorError("[Director Safety] GPU memory limit exceeded")

    guard = RecordingGuard()
    run = WrapperExecutor(lambda x, t: x, [make_guard_wrapper(guard)])
    small = torch.zeros(1, 24, 1, 4, 4)
    assert run(small, 0) is small
    # no context, no H3 model: the token count, priced as ComfyUI's stock block at the released widths
    assert guard.seen == [one_block] and forward_tokens(small) == 4
    with pytest.raises(H3DirectorError, match="Director Safety"):
        run(torch.zeros(1, 24, 4, 16, 16), 0)     # 256 tokens: 64x the rows


def test_out_of_memory_in_a_clip_frees_models_and_retries_bit_identically(video_vae):
    from oom_injection import OomOnClip

    from h3director.comfy.image_sink import ComfyImageSink
    from h3director.integrations.comfy_vae import ComfyH3VideoAdapter
    from h3director.video.faults import STAGE_MID
    from h3director.video.scheduler import DecodeOutOfMemory, stream_decode

    latent = _latent(t=12, h=8, w=8)
    freed = []
    adapter = ComfyH3VideoAdapter(video_vae, on_out_of_memory=lambda: freed.append(True))
    report = stream_decode(adapter, latent, ComfyImageSink(), fault_injector=OomOnClip(clips={1}, stage=STAGE_MID))
    assert freed == [True] and [r.clip for r in report.retries] == [1]
    assert torch.equal(report.result, vae_decode_node(video_vae, {"samples": latent}))
    with pytest.raises(DecodeOutOfMemory, match="clip 0"):
        stream_decode(adapter, latent, ComfyImageSink(), fault_injector=OomOnClip(clips={0}, times=2))
