"""Reading a media file for timing with PyAV: probe, picture motion and sound flux, streamed.

`probe` opens the file and demuxes every packet without decoding (cheap) so that a missing stream,
an unreadable or truncated file is refused before any work or output. `read_motion` decodes the
picture one frame at a time, keeps only a small gray copy of the previous frame and one number per
frame; `read_sound` decodes the sound one frame at a time into the streaming `AudioFlux` and `SoundLevel`. Memory is
independent of the file's length apart from the per-frame numbers (8 bytes a frame, 8 bytes a ms).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from h3director.av.envelopes import AudioFlux, Envelope, block_signature, motion_energy
from h3director.av.onsets import SoundLevel
from h3director.av.open_file import import_av, open_input
from h3director.errors import InvalidInputError

MOTION_WIDTH = 160  # frames are reduced to at most this many gray pixels across before differencing


@dataclass
class MediaInfo:
    """What `probe` found: picture and sound geometry, packet counts and durations (seconds)."""

    path: Path
    fps: float
    frames: int
    width: int
    height: int
    video_codec: str
    sample_rate: int
    channels: int
    audio_codec: str
    video_seconds: float
    audio_seconds: float

    @property
    def seconds(self) -> float:
        """The shorter stream's duration: offsets beyond it are refused."""
        return min(self.video_seconds, self.audio_seconds)


def probe(path: str | os.PathLike, need_audio: bool = True) -> MediaInfo:
    """Check `path` has one readable video stream (and an audio stream when `need_audio`) and that every
    packet demuxes; a file whose container declares more frames than it holds is called truncated. Returns
    the `MediaInfo`; `InvalidInputError` naming the file for a missing stream, no frames or samples, no
    frame rate, or an unreadable or truncated file."""
    av = import_av()
    source = Path(path)
    with open_input(source) as container:
        if not container.streams.video:
            raise InvalidInputError(f"{source}: no video stream")
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        if audio is None and need_audio:
            raise InvalidInputError(f"{source}: no audio stream; A/V sync needs both picture and sound")
        counts = {video.index: 0}
        ends = {video.index: 0.0}
        if audio is not None:
            counts[audio.index] = 0
            ends[audio.index] = 0.0
        streams = [s for s in (video, audio) if s is not None]
        try:
            for packet in container.demux(streams):
                if packet.size == 0 or packet.pts is None:
                    continue
                counts[packet.stream.index] += 1
                end = float((packet.pts + (packet.duration or 0)) * packet.time_base)
                ends[packet.stream.index] = max(ends[packet.stream.index], end)
        except (av.FFmpegError, OSError) as exc:
            raise InvalidInputError(f"{source}: unreadable or truncated media ({exc})") from None
        declared = int(video.frames or 0)
        if counts[video.index] == 0:
            raise InvalidInputError(f"{source}: the video stream holds no frames")
        if declared and counts[video.index] < declared:
            raise InvalidInputError(
                f"{source}: truncated: the container declares {declared} video frames, {counts[video.index]} are present")
        rate = video.average_rate or video.guessed_rate or video.base_rate
        if not rate:
            raise InvalidInputError(f"{source}: the video stream has no frame rate")
        start = float(video.start_time * video.time_base) if video.start_time is not None else 0.0
        info = MediaInfo(
            path=source, fps=float(rate), frames=counts[video.index], width=video.codec_context.width,
            height=video.codec_context.height, video_codec=video.codec_context.name,
            sample_rate=int(audio.codec_context.sample_rate) if audio is not None else 0,
            channels=int(audio.codec_context.channels) if audio is not None else 0,
            audio_codec=audio.codec_context.name if audio is not None else "",
            video_seconds=ends[video.index] - start,
            audio_seconds=ends[audio.index] if audio is not None else 0.0,
        )
        if audio is not None and (info.sample_rate <= 0 or counts[audio.index] == 0):
            raise InvalidInputError(f"{source}: the audio stream holds no samples")
    return info


def gray_frame(frame, width: int = MOTION_WIDTH) -> np.ndarray:
    """A decoded PyAV video frame as a small gray uint8 array (at most `width` pixels across)."""
    if frame.width > width:
        height = max(2, int(round(frame.height * width / frame.width)) // 2 * 2)
        frame = frame.reformat(width=width, height=height, format="gray")
    else:
        frame = frame.reformat(format="gray")
    return frame.to_ndarray()


def read_motion(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame times (seconds, from each frame's timestamp), the motion energy between consecutive frames
    (``len(times) - 1`` values) and each frame's `block_signature` (``[frames, 64]`` float32), decoding one
    frame at a time. `InvalidInputError` when the picture cannot be decoded."""
    av = import_av()
    times: list[float] = []
    energies: list[float] = []
    signatures: list[np.ndarray] = []
    previous = None
    with open_input(path) as container:
        video = container.streams.video[0]
        rate = float(video.average_rate or video.guessed_rate or 24)
        try:
            for index, frame in enumerate(container.decode(video)):
                times.append(float(frame.time) if frame.time is not None else index / rate)
                current = gray_frame(frame)
                signatures.append(block_signature(current))
                if previous is not None:
                    energies.append(motion_energy(previous, current))
                previous = current
        except av.FFmpegError as exc:
            raise InvalidInputError(f"{path}: the picture cannot be decoded ({exc})") from None
    return np.asarray(times), np.asarray(energies), np.asarray(signatures, np.float32).reshape(len(times), -1)


def read_sound(path: str | os.PathLike) -> tuple[Envelope, SoundLevel, int]:
    """The sound's spectral flux and its RMS level (channels mixed to mono) and its sample rate, decoding
    one frame at a time. Samples are placed from the first decoded frame's timestamp on, contiguously.
    `InvalidInputError` when the sound holds no samples or cannot be decoded."""
    av = import_av()
    with open_input(path) as container:
        audio = container.streams.audio[0]
        flux: AudioFlux | None = None
        level: SoundLevel | None = None
        try:
            for frame in container.decode(audio):
                mono = mono_samples(frame)
                if flux is None:
                    flux, level = AudioFlux(frame.sample_rate), SoundLevel(frame.sample_rate)
                    start = float(frame.time) if frame.time is not None else 0.0
                else:
                    start = 0.0
                flux.feed(mono, start)
                level.feed(mono, start)
        except av.FFmpegError as exc:
            raise InvalidInputError(f"{path}: the sound cannot be decoded ({exc})") from None
    if flux is None or level is None:
        raise InvalidInputError(f"{path}: the audio stream holds no samples")
    return flux.envelope(), level, flux.sample_rate


def frame_samples(frame) -> np.ndarray:
    """A decoded PyAV audio frame as float32 ``[channels, samples]`` in [-1, 1] (planar or packed, int or float)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:
        data = data.reshape(-1, channels).T
    if data.dtype.kind == "i":
        data = data.astype(np.float32) / float(np.iinfo(data.dtype).max)
    elif data.dtype.kind == "u":
        data = (data.astype(np.float32) - 128.0) / 128.0
    return np.ascontiguousarray(data, np.float32)


def mono_samples(frame) -> np.ndarray:
    return frame_samples(frame).mean(axis=0)


__all__ = ["MediaInfo", "frame_samples", "probe", "read_motion", "read_sound"]
