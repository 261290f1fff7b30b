"""Stitch chained segments that share `overlap` frames into one file, streaming, on the exact frame grid.

`stitch_files(paths, out, overlap=22, blend="crossfade")` writes ``sum(frames) - (k - 1) * overlap`` frames:

- video, `cut`: the earlier segment's frames are kept through the whole overlap and the later segment's first
  `overlap` frames are dropped (the later segment was conditioned on exactly those frames); `crossfade`: inside
  the overlap the later segment's weight rises linearly, ``(j + 1) / (overlap + 1)`` on overlap frame j
  (`timeline.video_weight`), per 8-bit plane of the decoded pixel format, rounded to nearest;
- audio: each later segment's sample 0 lands at the overlap's first frame (`timeline.sample_at`, the join
  instant) and the soundtracks are cross-faded over the overlap, in both blend modes: linearly where the two
  overlapping soundtracks are correlated (>= `timeline.CORRELATED`, as a segment conditioned on the previous
  one's last frames often is: equal power would make matching sound 3 dB louder mid-join), else with equal
  power (cos/sin) (`timeline.fade_gains`);
  the output soundtrack is as long as the picture (`Timeline.total_samples`), to the sample: with AAC the last
  frame's encoder padding is signalled (`audio_end`): in .mkv FFmpeg's decoder drops it, in .mp4/.mov the edit
  list states the exact length (players honouring edit lists stop there; FFmpeg's plain decode returns
  `StitchReport.audio_end_padding` samples more).

Outside the overlaps every frame is the decoder's frame, passed to the encoder in its own pixel format, and every
sample is the decoder's sample in its own type: with a lossless codec (`video_codec="h264-lossless"` or
`"ffv1"`, `audio_codec="pcm"` or `"flac"`) they decode back byte- and sample-equal. The default (`h264`, CRF 18,
and AAC) is lossy like every delivery encode.

Streaming: one segment's video and audio are decoded side by side (two demuxers on the file), one frame at a
time; audio is encoded up to each written frame's end instant, so the muxer interleaves without buffering.
Held at once: one decoded frame, the `overlap` tail frames of the earlier segment (crossfade only; planes
copied), the encoder's pictures in flight and about one frame of samples, whatever the number and length of
the segments. Every input is probed before anything is written (`inspect_segment`): a bad chain is refused
with `InvalidInputError` and nothing is created. The output is written under a hidden temporary name and
renamed over `out` only when complete (`h3director.core.atomic_file`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from h3director.av.audio_end import TRIMS_END_IN_DECODER, exact_length_options, flush_encoder
from h3director.av.open_file import import_av, open_input
from h3director.av.segment_audio import SampleReader, count_samples
from h3director.av.timeline import Timeline, check_chain, fade_gains, sample_at, video_weight
from h3director.core.atomic_file import check_output_path, commit, remove_quietly, temporary_path
from h3director.errors import InvalidInputError

BLENDS = ("cut", "crossfade")
CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska"}
VIDEO_CODECS = ("h264", "h264-lossless", "ffv1")
AUDIO_CODECS = ("aac", "pcm", "flac")
PASS_FORMATS = ("yuv420p", "yuv422p", "yuv444p", "yuvj420p", "yuvj422p", "yuvj444p")
"""8-bit planar pixel formats kept as decoded (both encoders take them); anything else is converted to yuv420p."""
LAYOUTS = {1: "mono", 2: "stereo"}


@dataclass(frozen=True)
class SegmentInfo:
    """One input segment as probed: frames (packets counted), picture size, exact frame rate, pixel format,
    audio rate, channels, samples per channel (decoded and counted) and their dtype."""

    path: Path
    frames: int
    width: int
    height: int
    fps: Fraction
    pix_fmt: str
    rate: int
    channels: int
    samples: int
    sample_dtype: np.dtype


@dataclass
class StitchReport:
    """What `stitch_files` wrote: the final path, frames, samples per channel (the sound's exact length, as the
    file signals it), the codecs, the silence padded at the end of each segment's audio (samples; a segment may
    miss up to one frame of sound), the law of each join's audio cross-fade ("linear" or "equal power",
    `timeline.fade_gains`), and the encoder's padding after the sound's end (`audio_end_padding`, samples; 0
    for PCM and FLAC) with `decoded_samples`, what FFmpeg's decoder (PyAV) returns from the file: `samples` where
    the container lets it drop that padding (.mkv), ``samples + audio_end_padding`` in .mp4/.mov, whose edit list
    states `samples` for players that honour it."""

    path: Path
    frames: int
    samples: int
    segments: int
    overlap: int
    blend: str
    video_codec: str
    audio_codec: str
    pix_fmt: str
    audio_padded: list[int] = field(default_factory=list)
    audio_fades: list[str] = field(default_factory=list)
    audio_end_padding: int = 0
    decoded_samples: int = 0


def inspect_segment(path: str | os.PathLike) -> SegmentInfo:
    """The `SegmentInfo` of the segment file at `path`, probed: one video and one audio stream (mono or
    stereo), every packet demuxes (video packets are counted, not decoded), the sound decodes.
    `InvalidInputError` naming the file for a missing stream, no frame rate, no frames, or a truncated
    container (one that declares more frames than it holds)."""
    av = import_av()
    with open_input(path) as container:
        if not container.streams.video:
            raise InvalidInputError(f"{path}: no video stream")
        if not container.streams.audio:
            raise InvalidInputError(f"{path}: no audio stream; every segment needs its soundtrack")
        video, sound = container.streams.video[0], container.streams.audio[0]
        rate = video.average_rate or video.guessed_rate or video.base_rate
        if not rate:
            raise InvalidInputError(f"{path}: the video stream has no frame rate")
        width, height = video.codec_context.width, video.codec_context.height
        pix_fmt = video.codec_context.pix_fmt or ""
        declared = int(video.frames or 0)
        seconds = float(container.duration) / 1e6 if container.duration else None
        sample_rate, channels = int(sound.codec_context.sample_rate), int(sound.codec_context.channels)
        frames = 0
        try:
            for packet in container.demux(video):
                if packet.size:
                    frames += 1
        except (av.FFmpegError, OSError) as exc:
            raise InvalidInputError(f"{path}: unreadable or truncated ({exc})") from None
    if frames == 0:
        raise InvalidInputError(f"{path}: the video stream holds no frames")
    if declared and frames < declared:
        raise InvalidInputError(f"{path}: truncated: the container declares {declared} frames, {frames} are present")
    if not declared and seconds is not None and frames < seconds * float(rate) - 1:
        raise InvalidInputError(f"{path}: truncated: the container lasts {seconds:.3f} s but holds {frames} frames "
                                f"at {float(rate):g} fps")
    if channels not in LAYOUTS:
        raise InvalidInputError(f"{path}: {channels} audio channels; stitching takes mono or stereo")
    samples, dtype = count_samples(path)
    return SegmentInfo(path=Path(path), frames=frames, width=width, height=height, fps=Fraction(rate),
                       pix_fmt=pix_fmt, rate=sample_rate, channels=channels, samples=samples, sample_dtype=dtype)


def plan_stitch(infos: Sequence[SegmentInfo], overlap: int) -> Timeline:
    """Refuse segments that cannot be chained (sizes, frame rates, sample rates, channels, overlap, audio too
    short by more than one frame) and return the output's `Timeline`."""
    first = infos[0]
    for info in infos[1:]:
        for what, mine, theirs in (("size", (info.width, info.height), (first.width, first.height)),
                                   ("frame rate", info.fps, first.fps), ("sample rate", info.rate, first.rate),
                                   ("audio channels", info.channels, first.channels)):
            if mine != theirs:
                show = (lambda v: f"{v[0]}x{v[1]}") if what == "size" else str
                raise InvalidInputError(f"{info.path}: {what} {show(mine)} differs from {first.path}'s {show(theirs)}; "
                                        "all segments must match")
    timeline = Timeline(tuple(i.frames for i in infos), int(overlap), first.fps, first.rate)
    check_chain(timeline.lengths, timeline.overlap)
    one_frame = math.ceil(first.rate / first.fps)
    for i, info in enumerate(infos):
        missing = timeline.samples_needed(i) - info.samples
        if missing > one_frame:
            raise InvalidInputError(
                f"{info.path}: its sound has {info.samples} samples but the stitched output needs "
                f"{timeline.samples_needed(i)} of it ({info.frames} frames at {float(first.fps):g} fps, "
                f"{first.rate} Hz): more than one frame of sound is missing")
    return timeline


def _audio_dtype(infos: Sequence[SegmentInfo], audio_codec: str) -> np.dtype:
    dtypes = {np.dtype(i.sample_dtype) for i in infos}
    common = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.float32)
    if audio_codec == "aac":
        return np.dtype(np.float32)
    if audio_codec == "flac" and common.kind == "f":
        raise InvalidInputError("flac stores integer samples and the segments' sound is floating point; "
                                "use --audio-codec pcm (lossless) or aac")
    return common


def _as_dtype(samples: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if samples.dtype == dtype:
        return samples
    if samples.dtype.kind in "iu" and dtype.kind == "f":
        return (samples.astype(np.float64) / float(np.iinfo(samples.dtype).max + 1)).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        scale = float(info.max + 1) if samples.dtype.kind == "f" else 1.0
        return np.clip(np.rint(samples.astype(np.float64) * scale), info.min, info.max).astype(dtype)
    return samples.astype(dtype)


def _mix(first: np.ndarray, second: np.ndarray, gains: tuple[np.ndarray, np.ndarray], dtype: np.dtype) -> np.ndarray:
    """`first` and `second` (``[channels, n]``) weighted by `gains` (``[n]`` each) and summed, in `dtype`."""
    mixed = first.astype(np.float64) * gains[0] + second.astype(np.float64) * gains[1]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.rint(mixed), info.min, info.max).astype(dtype)
    return mixed.astype(dtype)


class _AudioOut:
    """Walks the timeline's audio regions and encodes output samples up to a requested instant."""

    def __init__(self, timeline: Timeline, paths: Sequence[Path], stream, dtype: np.dtype, fmt: str, layout: str,
                 mux) -> None:
        self.regions = timeline.audio_regions()
        self.readers = [SampleReader(p) for p in paths]
        self.last_use = {}
        for index, region in enumerate(self.regions):
            for seg in (region.first, region.second):
                if seg is not None:
                    self.last_use[seg] = index
        self.stream, self.dtype, self.fmt, self.layout, self.mux = stream, dtype, fmt, layout, mux
        self.rate = timeline.rate
        self.produced = 0
        self.region = 0
        self._overlap: tuple | None = None
        self.fades: list[str] = []       # the law of each join's cross-fade, in order

    def _encode(self, block: np.ndarray) -> None:
        av = import_av()
        data = np.ascontiguousarray(block if self.fmt.endswith("p") else block.T.reshape(1, -1))
        frame = av.AudioFrame.from_ndarray(data, format=self.fmt, layout=self.layout)
        frame.sample_rate, frame.pts, frame.time_base = self.rate, self.produced, Fraction(1, self.rate)
        self.mux(self.stream.encode(frame))

    def until(self, upto: int) -> None:
        while self.produced < upto and self.region < len(self.regions):
            region = self.regions[self.region]
            count = min(region.stop, upto) - self.produced
            if region.second is None:
                block = _as_dtype(self.readers[region.first].read(count), self.dtype)
            else:
                if self._overlap is None:       # the whole overlap (under a second of sound), to choose the law
                    length = region.stop - region.start
                    first = _as_dtype(self.readers[region.first].read(length), self.dtype)
                    second = _as_dtype(self.readers[region.second].read(length), self.dtype)
                    gains = fade_gains(first, second)
                    self.fades.append(gains[2])
                    self._overlap = (first, second, gains[:2])
                first, second, gains = self._overlap
                at = self.produced - region.start
                block = _mix(first[:, at:at + count], second[:, at:at + count],
                             (gains[0][at:at + count], gains[1][at:at + count]), self.dtype)
            self._encode(block)
            self.produced += count
            if self.produced == region.stop:
                self._overlap = None
                for seg in (region.first, region.second):
                    if seg is not None and self.last_use[seg] == self.region:
                        self.readers[seg].close()
                self.region += 1

    def flush(self) -> int:
        """Drain the encoder, marking the last packet's end padding (`audio_end.mark_end_padding`); returns it."""
        packets, padding = flush_encoder(self.stream)
        self.mux(packets)
        return padding

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    @property
    def padded(self) -> list[int]:
        return [reader.padded for reader in self.readers]


def _planes(frame) -> list[np.ndarray]:
    """Views of an 8-bit planar frame's planes, ``[height, width]`` each (line padding cut off)."""
    return [np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, :p.width] for p in frame.planes]


def _blend(tail: list[np.ndarray], frame, weight: float):
    """A new frame: ``(1 - weight) * tail + weight * frame`` per plane, rounded to nearest."""
    av = import_av()
    out = av.VideoFrame(frame.width, frame.height, frame.format.name)
    for held, plane, dst in zip(tail, _planes(frame), _planes(out), strict=True):
        mixed = held.astype(np.float32) * (1 - weight) + plane.astype(np.float32) * weight
        dst[...] = np.rint(mixed).astype(np.uint8)
    return out


def _video_options(codec: str, crf: int, preset: str) -> tuple[str, dict]:
    if codec == "h264":
        return "libx264", {"crf": str(int(crf)), "preset": preset, "rc-lookahead": "10"}
    if codec == "h264-lossless":
        return "libx264", {"qp": "0", "preset": preset, "rc-lookahead": "10"}
    return "ffv1", {}


def _audio_encoder(codec: str, dtype: np.dtype) -> tuple[str, str]:
    """(encoder, frame format) for the output audio codec and the working sample dtype."""
    if codec == "aac":
        return "aac", "fltp"
    bits = {np.dtype(np.int16): "s16", np.dtype(np.int32): "s32", np.dtype(np.float32): "flt"}.get(np.dtype(dtype))
    if bits is None:
        raise InvalidInputError(f"no lossless audio encoder for {dtype} samples; use --audio-codec aac")
    if codec == "flac":
        return "flac", bits
    return {"s16": "pcm_s16le", "s32": "pcm_s32le", "flt": "pcm_f32le"}[bits], bits


def check_options(out: str | os.PathLike, blend: str, video_codec: str, audio_codec: str | None) -> tuple[Path, str]:
    """Refuse bad options before anything is read; returns the final path and the audio codec."""
    final = check_output_path(out, tuple(CONTAINERS), "stitch")
    if blend not in BLENDS:
        raise InvalidInputError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")
    if video_codec not in VIDEO_CODECS:
        raise InvalidInputError(f"video codec must be one of {', '.join(VIDEO_CODECS)}, got {video_codec!r}")
    audio_codec = audio_codec or ("aac" if video_codec == "h264" else "pcm")
    if audio_codec not in AUDIO_CODECS:
        raise InvalidInputError(f"audio codec must be one of {', '.join(AUDIO_CODECS)}, got {audio_codec!r}")
    if video_codec == "ffv1" and final.suffix.lower() != ".mkv":
        raise InvalidInputError(f"ffv1 video needs a .mkv output, got {final.name}")
    return final, audio_codec


def stitch_files(paths: Sequence[str | os.PathLike], out: str | os.PathLike, overlap: int = 22, *,
                 blend: str = "crossfade", video_codec: str = "h264", audio_codec: str | None = None,
                 crf: int = 18, preset: str = "medium") -> StitchReport:
    """Stitch the segment files `paths` (in chain order, each sharing `overlap` frames with the next) into
    `out` and return the `StitchReport`; see the module docstring for the exact rules. `audio_codec` None:
    AAC with `h264`, PCM with the lossless video codecs; `crf`/`preset` for libx264. Raises
    `InvalidInputError` before writing anything when the inputs or options are bad.
    """
    final, audio_codec = check_options(out, blend, video_codec, audio_codec)
    if len(paths) < 2:
        raise InvalidInputError(f"stitching needs at least two segments, got {len(paths)}")
    for path in paths:
        if Path(path).expanduser().absolute() == final:
            raise InvalidInputError(f"the output {final} is also an input; choose another name")
    infos = [inspect_segment(p) for p in paths]
    timeline = plan_stitch(infos, overlap)
    dtype = _audio_dtype(infos, audio_codec)
    audio_name, audio_fmt = _audio_encoder(audio_codec, dtype)
    formats = {i.pix_fmt for i in infos}
    pix_fmt = formats.pop() if len(formats) == 1 and infos[0].pix_fmt in PASS_FORMATS else "yuv420p"
    encoder, options = _video_options(video_codec, crf, preset)
    first = infos[0]
    if pix_fmt.endswith("420p") and (first.width % 2 or first.height % 2):
        raise InvalidInputError(f"{first.path}: {pix_fmt} needs an even width and height, got {first.width}x{first.height}")

    av = import_av()
    temp = temporary_path(final, "partial")
    remove_quietly(temp)
    fmt = CONTAINERS[final.suffix.lower()]
    container = av.open(str(temp), mode="w", format=fmt, options=exact_length_options(fmt, first.rate, first.fps))
    audio_out = None
    try:
        video = container.add_stream(encoder, rate=first.fps, options=options)
        video.width, video.height, video.pix_fmt = first.width, first.height, pix_fmt
        frame_base = Fraction(first.fps.denominator, first.fps.numerator)
        audio = container.add_stream(audio_name, rate=first.rate, layout=LAYOUTS[first.channels])

        def mux(packets) -> None:
            if packets:
                container.mux(packets)

        audio_out = _AudioOut(timeline, [i.path for i in infos], audio, dtype, audio_fmt, LAYOUTS[first.channels], mux)
        written = 0

        def emit(frame) -> None:
            nonlocal written
            if frame.format.name != pix_fmt:
                frame = frame.reformat(format=pix_fmt)
            frame.pts, frame.time_base, frame.pict_type = written, frame_base, 0
            mux(video.encode(frame))
            written += 1
            audio_out.until(sample_at(written, first.fps, first.rate))

        tail: list[list[np.ndarray]] = []
        k = len(infos)
        for i, info in enumerate(infos):
            head = overlap if i > 0 else 0
            keep = overlap if blend == "crossfade" and i < k - 1 else 0
            seen = 0
            with open_input(info.path) as source:
                try:
                    for frame in source.decode(source.streams.video[0]):
                        if seen >= info.frames:
                            break
                        if frame.format.name != pix_fmt:
                            frame = frame.reformat(format=pix_fmt)
                        if seen < head:
                            if blend == "crossfade":
                                emit(_blend(tail[seen], frame, video_weight(seen, overlap)))
                        elif seen >= info.frames - keep:
                            if seen == info.frames - keep:
                                tail = []
                            tail.append([plane.copy() for plane in _planes(frame)])
                        else:
                            emit(frame)
                        seen += 1
                except av.FFmpegError as exc:
                    raise InvalidInputError(f"{info.path}: the picture cannot be decoded at frame {seen} ({exc})") from None
            if seen != info.frames:
                raise InvalidInputError(f"{info.path}: {info.frames} video packets but {seen} frames decode")
        audio_out.until(timeline.total_samples)
        mux(video.encode(None))
        end_padding = audio_out.flush()
        audio_out.close()
        container.close()
        container = None
        if written != timeline.total_frames:   # pragma: no cover - the layout guarantees it
            raise AssertionError(f"wrote {written} frames, expected {timeline.total_frames}")
        commit(temp, final)
    except BaseException:
        if audio_out is not None:
            audio_out.close()
        if container is not None:
            try:
                container.close()
            except Exception:  # noqa: BLE001 - the partial file is deleted next
                pass
        remove_quietly(temp)
        raise
    return StitchReport(path=final, frames=timeline.total_frames, samples=timeline.total_samples, segments=k,
                        overlap=overlap, blend=blend, video_codec=video_codec, audio_codec=audio_codec,
                        pix_fmt=pix_fmt, audio_padded=audio_out.padded,
                        audio_fades=audio_out.fades, audio_end_padding=end_padding,
                        decoded_samples=timeline.total_samples + (0 if fmt in TRIMS_END_IN_DECODER else end_padding))


__all__ = ["AUDIO_CODECS", "BLENDS", "VIDEO_CODECS", "SegmentInfo", "StitchReport", "inspect_segment",
           "plan_stitch", "stitch_files"]
