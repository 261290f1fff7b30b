"""A video-file sink: frames are encoded with PyAV (FFmpeg) as they arrive, audio muxed alongside.

H.264 (libx264), yuv420p, constant-quality CRF; audio (when given) is encoded as AAC, its length stated exactly
(`h3director.av.audio_end`: the last frame's end padding signalled, an MP4 / MOV movie timescale of whole
samples; `audio_end_padding` says how many samples FFmpeg's own decoder still returns past the end of an MP4). The file is
written under a hidden temporary name in the destination folder and renamed over the final name in
`finish()`, so an existing file is replaced only by a complete one and `abort()` leaves nothing.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from h3director.av.audio_end import exact_length_options, flush_encoder
from h3director.av.open_file import import_av
from h3director.core.atomic_file import check_output_path, commit, remove_quietly, temporary_path
from h3director.errors import InvalidInputError
from h3director.video.sinks.contract import StreamSpec
from h3director.video.sinks.ordered import LONGEST_RUN_FRAMES, OrderedSink, require_single_video
from h3director.video.sinks.pixels import uint8_pixels

CONTAINER_FORMATS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska"}
AUDIO_LAYOUTS = {1: "mono", 2: "stereo"}
# libx264's rate-control lookahead in frames. Its presets use 10..60 (medium: 40); every frame in the
# lookahead holds full-resolution planes, so it is most of the encoder's memory, which then grows
# with the first `lookahead` frames of a video. 10 keeps it small and reached within the first clip.
DEFAULT_LOOKAHEAD = 10
# Pictures libx264 holds at the default lookahead (lookahead, B-frames, references, frame threads),
# each about 8 bytes per pixel with its half-pel planes and lowres copies: the basis of `bytes_needed`.
X264_FRAMES_HELD = 24
X264_BYTES_PER_PIXEL = 8


class VideoFileSink(OrderedSink):
    """Encode frames to an H.264 video file (`.mp4`, `.mov` or `.mkv`) as they are decoded.

    `fps` overrides `StreamSpec.fps`; `crf` is libx264's constant rate factor (0 = lossless, 18 =
    visually lossless, 51 = worst); `preset` is libx264's speed/size trade-off; `lookahead` is its
    rate-control lookahead in frames (None: the preset's own, 40 for medium). Pixels are the uint8
    frames of `Uint8FrameSink`, converted to yuv420p by FFmpeg, so width and height must be even.
    Audio from `write_audio` (`[1, channels, samples]`, float in [-1, 1], 1 or 2 channels) is
    encoded with `audio_codec` (AAC) and must arrive before the first video packet is written, or be
    declared up front with `audio_sample_rate` / `audio_channels`. One video per file: a batch of
    more than one is refused.

    Memory: one run of uint8 frames (up to an H3 clip, 17 frames of ``H * W * 3`` bytes) plus the
    encoder's pictures in flight (about `X264_FRAMES_HELD` of ``8 * H * W`` bytes at the default
    lookahead), whatever the video's length. `finish()` returns the final path.
    """

    supports_audio = True
    writes_to_disk = True

    def __init__(self, path: str | os.PathLike, fps: float | None = None, crf: int = 18, *,
                 preset: str = "medium", lookahead: int | None = DEFAULT_LOOKAHEAD, audio_codec: str = "aac",
                 audio_sample_rate: int | None = None, audio_channels: int = 2, threads: int = 1) -> None:
        super().__init__()
        self.path = check_output_path(path, tuple(CONTAINER_FORMATS), "VideoFileSink")
        if not 0 <= int(crf) <= 51:
            raise InvalidInputError(f"VideoFileSink: crf must be in 0..51, got {crf}")
        if fps is not None and not fps > 0:
            raise InvalidInputError(f"VideoFileSink: fps must be > 0, got {fps}")
        if audio_channels not in AUDIO_LAYOUTS:
            raise InvalidInputError(f"VideoFileSink: audio_channels must be 1 or 2, got {audio_channels}")
        if lookahead is not None and not 0 <= int(lookahead) <= 250:
            raise InvalidInputError(f"VideoFileSink: lookahead must be None or in 0..250 frames, got {lookahead}")
        self.fps, self.crf, self.preset, self.lookahead = fps, int(crf), preset, lookahead
        self.audio_codec, self.audio_sample_rate, self.audio_channels = audio_codec, audio_sample_rate, audio_channels
        self.threads = threads
        self._buffers = None
        self.temp_path = temporary_path(self.path, "partial")
        self._container = None
        self._format, self._fps = None, None
        self._video = None
        self._audio = None
        self._muxed = False
        self._audio_written = False
        self.audio_end_padding = 0
        """Samples of the last AAC frame beyond the sound (signalled: Matroska decoders drop them; FFmpeg returns
        them from an MP4 / MOV, whose edit list states the exact length)."""

    def bytes_needed(self, spec: StreamSpec) -> int:
        pixels = spec.height * spec.width
        lookahead = DEFAULT_LOOKAHEAD if self.lookahead is None else self.lookahead
        held = X264_FRAMES_HELD + max(0, lookahead - DEFAULT_LOOKAHEAD)
        return min(spec.frames, LONGEST_RUN_FRAMES) * pixels * spec.channels + held * pixels * X264_BYTES_PER_PIXEL

    # -- opening -----------------------------------------------------------------------------------
    def _open(self, spec: StreamSpec) -> None:
        require_single_video(spec, "VideoFileSink")
        if spec.channels != 3:
            raise InvalidInputError(f"VideoFileSink needs RGB frames (3 channels), got {spec.channels}")
        if spec.height % 2 or spec.width % 2:
            raise InvalidInputError(
                f"VideoFileSink: yuv420p needs an even width and height, got {spec.width}x{spec.height}; "
                "crop or pad the frames by one pixel, or use a .npy output"
            )
        av = import_av()
        fps = Fraction(self.fps if self.fps is not None else spec.fps).limit_denominator(1001)
        if fps <= 0:
            raise InvalidInputError(f"VideoFileSink: fps must be > 0, got {float(fps)}")
        self._format, self._fps = CONTAINER_FORMATS[self.path.suffix.lower()], fps
        remove_quietly(self.temp_path)
        self._container = av.open(str(self.temp_path), mode="w", format=self._format)
        try:
            options = {"crf": str(self.crf), "preset": self.preset}
            if self.lookahead is not None:
                options["rc-lookahead"] = str(int(self.lookahead))
            video = self._container.add_stream("libx264", rate=fps, options=options)
            video.width, video.height, video.pix_fmt = spec.width, spec.height, "yuv420p"
            self._video = video
            if self.audio_sample_rate is not None:
                self._add_audio_stream(self.audio_sample_rate, self.audio_channels)
        except Exception:
            self.abort()
            raise
        self._muxed = False
        self._audio_written = False

    def _add_audio_stream(self, sample_rate: int, channels: int) -> None:
        """Add the audio stream (before anything is muxed: the muxer reads its options when it writes the header)."""
        self._container.options.update(exact_length_options(self._format, int(sample_rate), self._fps))
        self._audio = self._container.add_stream(self.audio_codec, rate=int(sample_rate),
                                                 layout=AUDIO_LAYOUTS[channels])

    def _mux(self, packets) -> None:
        if packets:
            self._container.mux(packets)
            self._muxed = True

    # -- writing -----------------------------------------------------------------------------------
    def use_buffers(self, buffers) -> None:
        """Take each clip's uint8 staging (the frames as bytes before encoding) from `buffers`."""
        self._buffers = buffers

    def write_audio(self, samples: torch.Tensor, sample_rate: int) -> None:
        """Encode the whole soundtrack `[1, channels, samples]` (float, clamped to [-1, 1])."""
        if self._container is None:
            raise RuntimeError("VideoFileSink: begin(spec) has not been called")
        if self._audio_written:
            raise InvalidInputError("VideoFileSink: write_audio was already called; it takes the whole soundtrack once")
        if samples.dim() != 3 or samples.shape[0] != 1 or samples.shape[1] not in AUDIO_LAYOUTS:
            raise InvalidInputError(
                f"VideoFileSink: audio must be [1, channels (1 or 2), samples], got shape {list(samples.shape)}"
            )
        if not samples.is_floating_point() or samples.shape[2] == 0:
            raise InvalidInputError(
                f"VideoFileSink: audio must be non-empty floating point samples, got {samples.dtype} "
                f"with {samples.shape[2]} samples"
            )
        if sample_rate <= 0:
            raise InvalidInputError(f"VideoFileSink: sample_rate must be > 0, got {sample_rate}")
        channels = samples.shape[1]
        if self._audio is None:
            if self._muxed:
                raise InvalidInputError(
                    "VideoFileSink: audio arrived after video packets were written; pass "
                    "audio_sample_rate= (and audio_channels=) to VideoFileSink so the audio stream exists from the start"
                )
            self._add_audio_stream(sample_rate, channels)
        elif (self._audio.codec_context.sample_rate, self._audio.codec_context.channels) != (sample_rate, channels):
            raise InvalidInputError(
                f"VideoFileSink: audio was declared as {self._audio.codec_context.sample_rate} Hz x "
                f"{self._audio.codec_context.channels} channels, got {sample_rate} Hz x {channels}"
            )
        av = import_av()
        planar = np.ascontiguousarray(samples[0].detach().to("cpu", torch.float32).clamp(-1, 1).numpy())
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=AUDIO_LAYOUTS[channels])
        frame.sample_rate, frame.pts = int(sample_rate), 0
        self._mux(self._audio.encode(frame))
        packets, self.audio_end_padding = flush_encoder(self._audio)
        self._mux(packets)
        self._audio_written = True

    def _store(self, start: int, frames: torch.Tensor) -> None:
        av = import_av()
        spec = self.spec
        staging = None if self._buffers is None else self._buffers.staging_uint8(
            (frames.shape[2], spec.height, spec.width, spec.channels))
        pixels = uint8_pixels(frames[0], spec, out=None if staging is None else staging.numpy(), threads=self.threads)
        for offset in range(pixels.shape[0]):
            frame = av.VideoFrame.from_ndarray(pixels[offset], format="rgb24")
            frame.pts = start + offset
            self._mux(self._video.encode(frame))

    # -- ending ------------------------------------------------------------------------------------
    def finish(self) -> Path:
        self._check_complete()
        try:
            self._mux(self._video.encode(None))
            self._container.close()
            self._container = None
        except Exception:
            self.abort()
            raise
        return commit(self.temp_path, self.path)

    def abort(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            try:
                container.close()
            except Exception:  # noqa: BLE001 - the partial file is deleted next; a close error changes nothing
                pass
        remove_quietly(self.temp_path)


__all__ = ["CONTAINER_FORMATS", "VideoFileSink"]
