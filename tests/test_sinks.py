"""Frame sinks: exact values, the stock diffusers post-processing, atomic files, resume, refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import av
import numpy as np
import pytest
import torch

from h3director.errors import InvalidInputError
from h3director.video.sinks import (
    MemmapSink,
    StreamSpec,
    TensorSink,
    Uint8FrameSink,
    VideoFileSink,
    file_sink_for,
)


def _h3_pixel_convention() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The stock H3 pipeline's own pixel mean/std (read from diffusers, not retyped here)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    return (tuple(MiniMaxH3ModularPipeline.pixel_mean.fget(None)),
            tuple(MiniMaxH3ModularPipeline.pixel_std.fget(None)))


H3_MEAN, H3_STD = _h3_pixel_convention()


def _spec(batch=1, frames=11, height=16, width=24, h3=True) -> StreamSpec:
    return StreamSpec(batch=batch, channels=3, frames=frames, height=height, width=width, fps=24.0,
                      pixel_mean=H3_MEAN if h3 else None, pixel_std=H3_STD if h3 else None)


def _decoded(spec: StreamSpec, seed: int = 0) -> torch.Tensor:
    """Decoder-space frames covering the clamp on both sides (values far outside [0, 1] pixels)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (spec.batch, spec.channels, spec.frames, spec.height, spec.width)
    return torch.randn(shape, generator=generator) * 2.5


def _feed(sink, spec: StreamSpec, video: torch.Tensor, runs=(4, 1, 6)) -> object:
    """Drive a sink as the scheduler does: begin, runs of uneven length in order, finish."""
    sink.begin(spec)
    start = 0
    sizes = list(runs)
    while start < spec.frames:
        count = min(sizes.pop(0) if sizes else 5, spec.frames - start)
        sink.write(start, video[:, :, start:start + count])
        start += count
    return sink.finish()


def _stock_uint8(video: torch.Tensor, h3: bool = True) -> np.ndarray:
    """diffusers' own post-processing to uint8 frames, `[B * F, H, W, 3]`.

    H3: `MiniMaxH3VideoDecodeStep` de-normalises with the pipeline's pixel mean/std and clamps, then
    `VideoProcessor(do_normalize=False).postprocess_video(..., output_type="pil")`. [-1, 1] decoders
    (Wan): `VideoProcessor(do_normalize=True)` does the (x + 1) / 2 itself.
    """
    from diffusers.video_processor import VideoProcessor

    if h3:
        mean = torch.tensor(H3_MEAN).view(1, -1, 1, 1, 1)
        std = torch.tensor(H3_STD).view(1, -1, 1, 1, 1)
        video = (video.float() * std + mean).clamp(0, 1)
    processor = VideoProcessor(vae_scale_factor=16, do_normalize=not h3)
    batches = processor.postprocess_video(video, output_type="pil")
    frames = [np.asarray(image) for batch in batches for image in batch]
    return np.stack(frames)


# -- in-memory sinks ---------------------------------------------------------------------------------

def test_tensor_sink_float32_is_bit_identical():
    spec = _spec(batch=2)
    video = _decoded(spec)
    result = _feed(TensorSink(), spec, video)
    assert result.dtype == torch.float32
    assert torch.equal(result, video)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_sink_half_precision_rounds_once(dtype):
    spec = _spec()
    video = _decoded(spec)
    result = _feed(TensorSink(dtype=dtype), spec, video)
    assert result.dtype == dtype
    assert torch.equal(result, video.to(dtype))


def test_tensor_sink_bytes_needed_is_its_buffer():
    spec = _spec(batch=2, frames=7)
    assert TensorSink().bytes_needed(spec) == 2 * 3 * 7 * 16 * 24 * 4
    assert TensorSink(dtype=torch.float16).bytes_needed(spec) == 2 * 3 * 7 * 16 * 24 * 2


@pytest.mark.parametrize("h3", [True, False], ids=["h3-imagenet", "minus1-1"])
def test_uint8_sink_equals_stock_diffusers_postprocessing(h3):
    spec = _spec(batch=2, frames=9, h3=h3)
    video = _decoded(spec, seed=3)
    result = _feed(Uint8FrameSink(), spec, video)
    assert result.dtype == np.uint8 and result.shape == (2 * 9, 16, 24, 3)
    np.testing.assert_array_equal(result, _stock_uint8(video, h3=h3))


def test_uint8_sink_equals_torch_reference_expression():
    spec = _spec(frames=5)
    video = _decoded(spec, seed=4)
    mean = torch.tensor(H3_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(H3_STD).view(1, 3, 1, 1, 1)
    expected = ((video.float() * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)
    result = _feed(Uint8FrameSink(), spec, video)
    np.testing.assert_array_equal(result, expected[0].permute(1, 2, 3, 0).numpy())
    assert Uint8FrameSink().bytes_needed(spec) == result.nbytes


def test_sinks_refuse_bad_runs():
    spec = _spec(frames=6)
    video = _decoded(spec)
    sink = Uint8FrameSink()
    sink.begin(spec)
    with pytest.raises(InvalidInputError, match=r"expected frames \[B=1, C=3, n, H=16, W=24\]"):
        sink.write(0, video[:, :, :2, :8])
    with pytest.raises(InvalidInputError, match="in order without gaps: next expected frame 0"):
        sink.write(2, video[:, :, 2:4])
    with pytest.raises(InvalidInputError, match="outside the video's 6 frames"):
        sink.write(0, torch.cat([video, video], dim=2))
    sink.write(0, video[:, :, :3])
    with pytest.raises(InvalidInputError, match="finish\\(\\) after 3 of 6 frames"):
        sink.finish()
    with pytest.raises(InvalidInputError, match="pixel_mean has 2 values"):
        sink.begin(StreamSpec(1, 3, 4, 8, 8, 24.0, (0.5, 0.5), (0.5, 0.5)))


# -- memmap sink -------------------------------------------------------------------------------------

def test_memmap_uint8_loads_with_mmap_and_equals_uint8_sink(tmp_path):
    spec = _spec(frames=13)
    video = _decoded(spec, seed=5)
    path = _feed(MemmapSink(tmp_path / "frames.npy"), spec, video)
    loaded = np.load(path, mmap_mode="r")
    assert isinstance(loaded, np.memmap) and loaded.shape == (13, 16, 24, 3) and loaded.dtype == np.uint8
    np.testing.assert_array_equal(loaded, _stock_uint8(video))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames.npy"]


def test_memmap_float32_equals_stock_float_pixels(tmp_path):
    spec = _spec(frames=7)
    video = _decoded(spec, seed=6)
    path = _feed(MemmapSink(tmp_path / "frames.npy", dtype="float32"), spec, video)
    mean = torch.tensor(H3_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(H3_STD).view(1, 3, 1, 1, 1)
    stock = (video.float() * std + mean).clamp(0, 1)[0].permute(1, 2, 3, 0).numpy()
    loaded = np.load(path, mmap_mode="r")
    assert loaded.dtype == np.float32
    assert np.array_equal(loaded, stock)


def test_memmap_abort_removes_temporaries_and_keeps_existing_output(tmp_path):
    final = tmp_path / "frames.npy"
    final.write_bytes(b"an earlier result")
    spec = _spec(frames=8)
    video = _decoded(spec)
    sink = MemmapSink(final)
    sink.begin(spec)
    sink.write(0, video[:, :, :3])
    assert final.read_bytes() == b"an earlier result"
    sink.abort()
    assert final.read_bytes() == b"an earlier result"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames.npy"]
    _feed(MemmapSink(final), spec, video)
    np.testing.assert_array_equal(np.load(final), _stock_uint8(video))


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys, torch
    from h3director.video.sinks import MemmapSink, StreamSpec
    path, mean, std = sys.argv[1], eval(sys.argv[2]), eval(sys.argv[3])
    spec = StreamSpec(1, 3, 12, 16, 24, 24.0, mean, std)
    video = torch.randn((1, 3, 12, 16, 24), generator=torch.Generator().manual_seed(7)) * 2.5
    sink = MemmapSink(path, job="job-1")
    sink.begin(spec)
    sink.write(0, video[:, :, :4])
    sink.write(4, video[:, :, 4:7])
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_memmap_resumes_after_a_killed_process(tmp_path):
    final = tmp_path / "frames.npy"
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(final), repr(H3_MEAN), repr(H3_STD)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The killed job left only hidden temporaries: nothing under the final name, nothing ending in .npy.
    assert not final.exists()
    assert all(not p.name.endswith(".npy") for p in tmp_path.iterdir())

    spec = _spec(frames=12)
    video = _decoded(spec, seed=7)
    with pytest.raises(InvalidInputError, match="belongs to a different job"):
        MemmapSink(final, resume=True, job="job-2").begin(spec)

    sink = MemmapSink(final, resume=True, job="job-1")
    sink.begin(spec)
    assert sink.resume_from() == 7 and sink.frames_written == 7
    # Frames 0..6 are already on disk: a rerun's copies of them are skipped (zeros here prove it).
    sink.write(0, torch.zeros_like(video[:, :, :7]))
    sink.write(7, video[:, :, 7:])
    path = sink.finish()
    np.testing.assert_array_equal(np.load(path, mmap_mode="r"), _stock_uint8(video))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames.npy"]


def test_memmap_without_resume_starts_over_and_resumable_abort_keeps_progress(tmp_path):
    final = tmp_path / "frames.npy"
    spec = _spec(frames=10)
    video = _decoded(spec, seed=8)
    sink = MemmapSink(final, resume=True)
    sink.begin(spec)
    sink.write(0, video[:, :, :5])
    sink.abort()  # resumable: the partial file and its progress stay
    assert len(list(tmp_path.iterdir())) == 2 and not final.exists()

    fresh = MemmapSink(final, resume=False)
    fresh.begin(spec)
    assert fresh.frames_written == 0
    with pytest.raises(InvalidInputError, match="in order without gaps: next expected frame 0"):
        fresh.write(5, video[:, :, 5:])
    fresh.abort()
    assert list(tmp_path.iterdir()) == []


def test_memmap_refuses_corrupt_progress_record(tmp_path):
    final = tmp_path / "frames.npy"
    spec = _spec(frames=6)
    sink = MemmapSink(final, resume=True)
    sink.begin(spec)
    sink.abort()
    sink.progress_path.write_text('{"format": "h3director.memmap-progress", "frames_done": -3}')
    with pytest.raises(InvalidInputError, match="frames_done must be an int >= 0"):
        MemmapSink(final, resume=True).begin(spec)
    sink.progress_path.write_text("not json")
    with pytest.raises(InvalidInputError, match="is unreadable"):
        MemmapSink(final, resume=True).begin(spec)


def test_file_sinks_refuse_batches_and_bad_paths(tmp_path):
    spec = _spec(batch=2)
    with pytest.raises(InvalidInputError, match="MemmapSink takes one video, got a batch of 2"):
        MemmapSink(tmp_path / "a.npy").begin(spec)
    with pytest.raises(InvalidInputError, match="VideoFileSink takes one video, got a batch of 2"):
        VideoFileSink(tmp_path / "a.mp4").begin(spec)
    with pytest.raises(InvalidInputError, match="output must end in .npy"):
        MemmapSink(tmp_path / "a.npz")
    with pytest.raises(InvalidInputError, match="output folder .* does not exist"):
        VideoFileSink(tmp_path / "missing" / "a.mp4")
    with pytest.raises(InvalidInputError, match="cannot tell the output kind of .*video.gif"):
        file_sink_for(tmp_path / "video.gif")
    assert isinstance(file_sink_for(tmp_path / "v.MP4"), VideoFileSink)
    assert isinstance(file_sink_for(tmp_path / "f.npy"), MemmapSink)
    assert list(tmp_path.iterdir()) == []


# -- video file sink ---------------------------------------------------------------------------------

def _smooth_video(spec: StreamSpec) -> torch.Tensor:
    """Gradients that move over time: easy for H.264, so decoded pixels stay close to the source."""
    f = torch.arange(spec.frames).view(1, 1, -1, 1, 1)
    y = torch.linspace(0, 1, spec.height).view(1, 1, 1, -1, 1)
    x = torch.linspace(0, 1, spec.width).view(1, 1, 1, 1, -1)
    phase = torch.tensor([0.0, 0.3, 0.6]).view(1, 3, 1, 1, 1)
    pixels = 0.5 + 0.4 * torch.sin(6 * (x + y) + 0.2 * f + phase)
    mean = torch.tensor(H3_MEAN).view(1, 3, 1, 1, 1)
    std = torch.tensor(H3_STD).view(1, 3, 1, 1, 1)
    return ((pixels - mean) / std).expand(spec.batch, -1, -1, -1, -1).contiguous()


def test_video_sink_writes_h264_with_aac_audio(tmp_path):
    spec = _spec(frames=15, height=48, width=64)
    video = _smooth_video(spec)
    sink = VideoFileSink(tmp_path / "out.mp4", crf=10)
    sink.begin(spec)
    tone = torch.sin(torch.arange(16_000) * 2 * torch.pi * 440 / 32_000).view(1, 1, -1).repeat(1, 2, 1)
    sink.write_audio(tone * 0.5, 32_000)
    for start in range(0, 15, 4):
        sink.write(start, video[:, :, start:start + 4])
    path = sink.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]

    expected = _stock_uint8(video).astype(np.int16)
    with av.open(str(path)) as container:
        vstream, astream = container.streams.video[0], container.streams.audio[0]
        assert vstream.codec_context.name == "h264" and vstream.codec_context.pix_fmt == "yuv420p"
        assert (vstream.width, vstream.height) == (64, 48)
        assert astream.codec_context.name == "aac" and astream.rate == 32_000 and astream.channels == 2
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 15
    error = np.abs(np.stack(decoded).astype(np.int16) - expected)
    assert error.mean() < 3.0


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_video_sink_states_the_exact_sound_length(tmp_path, suffix):
    """16,001 samples at 32 kHz: not whole AAC frames (the encoder pads the last to 1,024) and not whole milliseconds
    (an MP4 edit list at FFmpeg's default 1,000 ticks a second would round it). Matroska: FFmpeg's decoder returns
    exactly the sound; MP4: the stream states it exactly and the decoder returns the signalled padding besides."""
    spec = _spec(frames=4, height=48, width=64)
    sink = VideoFileSink(tmp_path / f"out{suffix}", preset="ultrafast")
    sink.begin(spec)
    sink.write_audio(torch.zeros(1, 2, 16_001), 32_000)
    sink.write(0, _smooth_video(spec))
    path = sink.finish()
    assert 0 < sink.audio_end_padding < 1024
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        decoded = sum(frame.samples for frame in container.decode(stream))
        stated = stream.duration * stream.time_base * 32_000 if stream.duration else None
    if suffix == ".mkv":
        assert decoded == 16_001
    else:
        assert stated == 16_001 and decoded == 16_001 + sink.audio_end_padding


def test_video_sink_refuses_odd_sizes_and_late_audio(tmp_path):
    with pytest.raises(InvalidInputError, match="even width and height, got 25x16"):
        VideoFileSink(tmp_path / "a.mp4").begin(_spec(width=25))
    with pytest.raises(InvalidInputError, match="crf must be in 0..51"):
        VideoFileSink(tmp_path / "a.mp4", crf=60)
    assert list(tmp_path.iterdir()) == []

    spec = _spec(frames=60, height=32, width=32)
    video = _smooth_video(spec)
    sink = VideoFileSink(tmp_path / "a.mp4", preset="ultrafast")
    sink.begin(spec)
    sink.write(0, video)  # ultrafast has no lookahead: packets are muxed at once
    with pytest.raises(InvalidInputError, match="audio arrived after video packets were written"):
        sink.write_audio(torch.zeros(1, 2, 800), 32_000)
    sink.abort()
    assert list(tmp_path.iterdir()) == []


def test_video_sink_keeps_existing_file_until_finish(tmp_path):
    final = tmp_path / "clip.mp4"
    final.write_bytes(b"previous render")
    spec = _spec(frames=6, height=32, width=32)
    video = _smooth_video(spec)
    sink = VideoFileSink(final, audio_sample_rate=32_000)
    sink.begin(spec)
    sink.write(0, video[:, :, :3])
    assert final.read_bytes() == b"previous render"
    sink.abort()
    assert final.read_bytes() == b"previous render"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]

    sink = VideoFileSink(final, audio_sample_rate=32_000)
    sink.begin(spec)
    sink.write(0, video[:, :, :3])
    sink.write_audio(torch.zeros(1, 2, 8_000), 32_000)  # declared up front, so it may come late
    sink.write(3, video[:, :, 3:])
    sink.finish()
    with av.open(str(final)) as container:
        assert len(container.streams.audio) == 1
        assert sum(1 for _ in container.decode(video=0)) == 6
    assert os.path.getsize(final) > len(b"previous render")


# -- composed sinks ----------------------------------------------------------------------------------

def test_tee_feeds_every_sink_and_digests_match_the_stored_frames(tmp_path):
    from h3director.video.sinks import DigestSink, TeeSink
    from h3director.video.sinks.digest import frame_digests

    spec = _spec(frames=9)
    video = _decoded(spec, seed=9)
    digest = DigestSink()
    tensor, frames, path = _feed(TeeSink([TensorSink(), Uint8FrameSink(), MemmapSink(tmp_path / "f.npy"), digest]),
                                 spec, video)[:3]
    assert torch.equal(tensor, video)
    assert digest.uint8_digests == frame_digests(frames, frame_axis=0) == frame_digests(np.load(path), frame_axis=0)
    assert digest.raw_digests == frame_digests(video[0], frame_axis=1)
    assert digest.raw_digests != frame_digests(video[0] + 1e-3, frame_axis=1)


def test_tee_aborts_every_sink_when_one_fails(tmp_path):
    from h3director.video.sinks import TeeSink

    final = tmp_path / "f.npy"
    spec = _spec(frames=6, width=25)  # odd width: the video sink refuses it in begin()
    tee = TeeSink([MemmapSink(final), VideoFileSink(tmp_path / "v.mp4")])
    with pytest.raises(InvalidInputError, match="even width and height"):
        tee.begin(spec)
    assert list(tmp_path.iterdir()) == []
    assert tee.supports_audio  # one of its sinks (the video file) takes audio
    with pytest.raises(InvalidInputError, match="lookahead must be None or in 0..250"):
        VideoFileSink(tmp_path / "v.mp4", lookahead=-1)


def test_file_sinks_reserve_the_longest_run_a_decode_writes(tmp_path):
    # The last H3 clip writes its 17-frame body and 5-frame tail in one call: 22 frames of 640x384x3.
    spec = StreamSpec(batch=1, channels=3, frames=277, height=384, width=640, fps=24.0)
    frame = 384 * 640 * 3
    assert MemmapSink(tmp_path / "v.npy").bytes_needed(spec) == 22 * frame
    assert VideoFileSink(tmp_path / "v.mp4").bytes_needed(spec) >= 22 * frame
    short = StreamSpec(batch=1, channels=3, frames=5, height=384, width=640, fps=24.0)
    assert MemmapSink(tmp_path / "w.npy").bytes_needed(short) == 5 * frame
