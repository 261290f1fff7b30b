"""A/V offset correction of a media file: move the sound by whole samples, or the picture by whole frames.

Both take the offset to remove in the measurement's convention (`offset_ms` > 0: the audio is late)
and stream: nothing holds more than one decoded audio frame plus the shift, or one picture.

* `shift_audio_file`: the sound moves by ``round(offset_ms * sample_rate / 1000)`` samples, earlier
  when the audio is late. The video packets are copied as they are (not decoded, byte-identical);
  the sound is decoded, shifted and re-encoded (AAC; the shift is sample-exact, the re-encode is
  lossy like any AAC encode). Audio late: the first samples are dropped and silence is appended at
  the end; audio early: silence is put in front and the last samples are dropped. The sample count
  is unchanged, and the file says so: the encoder's end padding is signalled as `stitch` does
  (`h3director.av.audio_end`: Matroska's DiscardPadding, which FFmpeg's decoder drops; MP4 / MOV's edit
  list in a movie timescale of whole samples, which FFmpeg's decoder does not apply to the end:
  `ShiftReport.audio_end_padding` samples more).
* `shift_video_file`: the picture moves by ``round(offset_ms * fps / 1000)`` frames, later when the
  audio is late: the first frame repeats at the start and the last frames are dropped (audio early:
  the first frames are dropped and the last frame repeats). Re-encoded with libx264; the sound's
  packets are copied. The frame count is unchanged.

The output is written under a hidden temporary name and renamed over the final name only when
complete (`core.atomic_file`); every check (streams, readability, truncation, the offset within
the clip) runs before anything is written.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from h3director.av.audio_end import exact_length_options, flush_encoder
from h3director.av.media import MediaInfo, frame_samples, probe
from h3director.av.open_file import import_av, open_input
from h3director.core.atomic_file import check_output_path, commit, remove_quietly, temporary_path
from h3director.errors import InvalidInputError

OUTPUT_FORMATS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska"}
AUDIO_LAYOUTS = {1: "mono", 2: "stereo"}
AUDIO_LEAD_S = 0.5  # the sound is written this far ahead of the video packets, for interleaving


@dataclass
class ShiftReport:
    """What a fix did: the offset removed (ms), the move in samples or frames, and the output path."""

    path: Path
    offset_ms: float
    mode: str          # "audio" or "frames"
    samples: int = 0   # audio moved by this many samples (negative: earlier)
    frames: int = 0    # picture moved by this many frames (negative: earlier)
    sample_rate: int = 0
    fps: float = 0.0
    audio_end_padding: int = 0  # samples of the re-encoded sound's last AAC frame beyond its end (signalled)

    def to_dict(self) -> dict:
        return {"out": str(self.path), "offset_ms": round(self.offset_ms, 3), "mode": self.mode,
                "samples": self.samples, "frames": self.frames, "sample_rate": self.sample_rate,
                "fps": round(self.fps, 6), "audio_end_padding": self.audio_end_padding}


@contextlib.contextmanager
def _rewriting(source: str | os.PathLike, final: Path) -> Iterator[Path]:
    """Yield the hidden temporary name of `final` (a stale one removed first); when the block succeeds,
    `commit` it to `final`; when it fails, remove it and re-raise, an FFmpeg error as an
    `InvalidInputError` naming `source`."""
    av = import_av()
    temporary = temporary_path(final, "partial")
    remove_quietly(temporary)
    try:
        yield temporary
    except av.FFmpegError as exc:
        remove_quietly(temporary)
        raise InvalidInputError(f"{source}: cannot be rewritten ({exc})") from None
    except BaseException:
        remove_quietly(temporary)
        raise
    commit(temporary, final)


def _check_offset(offset_ms: float) -> float:
    offset_ms = float(offset_ms)
    if not math.isfinite(offset_ms):
        raise InvalidInputError(f"offset must be a finite number of milliseconds, got {offset_ms}")
    return offset_ms


def _prepare(source: str | os.PathLike, out: str | os.PathLike) -> tuple[MediaInfo, Path]:
    info = probe(source)
    final = check_output_path(out, tuple(OUTPUT_FORMATS), "avsync fix")
    if final == Path(source).expanduser().absolute():
        raise InvalidInputError(f"avsync fix: the output {final} is the input; write to another file")
    if info.channels not in AUDIO_LAYOUTS:
        raise InvalidInputError(f"{source}: {info.channels} audio channels; avsync fix handles mono and stereo")
    return info, final


def audio_shift_samples(offset_ms: float, sample_rate: int) -> int:
    """Samples the sound moves to remove `offset_ms` (audio late > 0): negative = earlier."""
    return -int(round(offset_ms * sample_rate / 1000.0))


def video_shift_frames(offset_ms: float, fps: float) -> int:
    """Frames the picture moves to remove `offset_ms` (audio late > 0): positive = later."""
    return int(round(offset_ms * fps / 1000.0))


def shift_audio_file(source: str | os.PathLike, out: str | os.PathLike, offset_ms: float) -> ShiftReport:
    """Write `source` to `out` with `offset_ms` (ms, positive = audio late) removed by moving the sound by
    whole samples; the video packets are copied (see module doc). Returns the `ShiftReport`.
    `InvalidInputError` for a bad offset or path, or a move beyond the clip's sound."""
    av = import_av()
    offset_ms = _check_offset(offset_ms)
    info, final = _prepare(source, out)
    shift = audio_shift_samples(offset_ms, info.sample_rate)
    total = int(round(info.audio_seconds * info.sample_rate))
    if abs(shift) >= total:
        raise InvalidInputError(
            f"offset {offset_ms:g} ms moves the sound by {abs(shift)} samples, beyond the clip's {total} "
            f"({info.audio_seconds:.3f} s)")
    fmt = OUTPUT_FORMATS[final.suffix.lower()]
    with _rewriting(source, final) as temporary, open_input(source) as video_in, open_input(source) as audio_in, \
            av.open(str(temporary), mode="w", format=fmt,
                    options=exact_length_options(fmt, info.sample_rate, info.fps)) as output:
        video_stream = video_in.streams.video[0]
        video_out = output.add_stream_from_template(video_stream)
        audio_out = output.add_stream("aac", rate=info.sample_rate, layout=AUDIO_LAYOUTS[info.channels])
        sound = _shifted_sound(audio_in, shift, info.channels)
        written = 0.0  # seconds of sound muxed so far

        def write_sound_until(limit_s: float | None) -> None:
            nonlocal written
            for start, block in sound:
                frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=AUDIO_LAYOUTS[info.channels])
                frame.sample_rate, frame.pts = info.sample_rate, start
                output.mux(audio_out.encode(frame))
                written = (start + block.shape[1]) / info.sample_rate
                if limit_s is not None and written > limit_s:
                    return

        for packet in with_dts(video_in.demux(video_stream), info.fps):
            time_s = float(packet.dts * packet.time_base)
            if written <= time_s + AUDIO_LEAD_S:
                write_sound_until(time_s + AUDIO_LEAD_S)
            packet.stream = video_out
            output.mux(packet)
        write_sound_until(None)
        packets, padding = flush_encoder(audio_out)
        output.mux(packets)
    return ShiftReport(final, offset_ms, "audio", samples=shift, sample_rate=info.sample_rate, fps=info.fps,
                       audio_end_padding=padding)


def with_dts(packets, fps: float):
    """The non-empty `packets` of one stream, in order, each with a decoding timestamp. Some containers
    (Matroska) store none for the first packets of a stream with B-frames; those get the first known
    one minus one frame per packet still to come, later gaps the previous one plus a frame, as FFmpeg
    does when it remuxes. Payloads and presentation timestamps are untouched."""
    waiting = []
    previous = None
    for packet in packets:
        if packet.size == 0:
            continue
        step = packet.duration or max(1, int(round(1 / (fps * packet.time_base))))
        if packet.dts is None and previous is None:
            waiting.append(packet)
            continue
        if packet.dts is None:
            packet.dts = previous + step
        for back, early in enumerate(waiting):
            early.dts = packet.dts - (len(waiting) - back) * step
            yield early
        waiting = []
        previous = packet.dts
        yield packet
    for early in waiting:  # no packet had one: decoding order is presentation order (no B-frames)
        early.dts = early.pts
        yield early


def _shifted_sound(container, shift: int, channels: int):
    """Yield ``(first sample index, float32 [channels, n])`` blocks of the decoded sound moved by `shift`
    samples (positive: later, silence in front, the tail dropped; negative: the head dropped, silence at
    the end); as many samples come out as went in. Sample indices count from the first decoded sample's
    own timestamp."""
    stream = container.streams.audio[0]
    pending = np.zeros((channels, max(shift, 0)), np.float32)
    skip = max(-shift, 0)
    emitted, first = 0, None
    for frame in container.decode(stream):
        block = frame_samples(frame)
        if first is None:
            first = int(round(float(frame.time or 0.0) * frame.sample_rate))
        taken = block.shape[1]
        if skip:
            dropped = min(skip, taken)
            block, skip = block[:, dropped:], skip - dropped
        if shift >= 0:
            pending = np.concatenate([pending, block], axis=1)
            out, pending = pending[:, :taken], pending[:, taken:]
        else:
            out = block
        if out.shape[1]:
            yield first + emitted, np.ascontiguousarray(out)
            emitted += out.shape[1]
    if shift < 0 and first is not None:
        yield first + emitted, np.zeros((channels, -shift), np.float32)


def shift_video_file(source: str | os.PathLike, out: str | os.PathLike, offset_ms: float,
                     crf: int = 18, preset: str = "medium") -> ShiftReport:
    """Write `source` to `out` with `offset_ms` (ms, positive = audio late) removed by moving the picture
    by whole frames (re-encoded, libx264 `crf`/`preset`); the sound's packets are copied (see module doc).
    Returns the `ShiftReport`. `InvalidInputError` for a bad offset or path, or a move beyond the clip's
    frames."""
    av = import_av()
    offset_ms = _check_offset(offset_ms)
    if not 0 <= int(crf) <= 51:
        raise InvalidInputError(f"crf must be in 0..51, got {crf}")
    info, final = _prepare(source, out)
    shift = video_shift_frames(offset_ms, info.fps)
    if abs(shift) >= info.frames:
        raise InvalidInputError(
            f"offset {offset_ms:g} ms moves the picture by {abs(shift)} frames, beyond the clip's {info.frames}")
    if info.width % 2 or info.height % 2:
        raise InvalidInputError(f"{source}: yuv420p needs an even width and height, got {info.width}x{info.height}")
    with _rewriting(source, final) as temporary, open_input(source) as source_in, \
            av.open(str(temporary), mode="w", format=OUTPUT_FORMATS[final.suffix.lower()]) as output:
        video_in, audio_in = source_in.streams.video[0], source_in.streams.audio[0]
        rate = Fraction(video_in.average_rate or Fraction(info.fps).limit_denominator(1001))
        video_out = output.add_stream("libx264", rate=rate, options={"crf": str(int(crf)), "preset": preset})
        video_out.width, video_out.height, video_out.pix_fmt = info.width, info.height, "yuv420p"
        audio_out = output.add_stream_from_template(audio_in)
        emitted = 0

        def emit(planes: np.ndarray) -> None:
            nonlocal emitted
            if emitted >= info.frames:
                return
            picture = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            picture.pts = emitted
            output.mux(video_out.encode(picture))
            emitted += 1

        seen, last = 0, None
        for packet in source_in.demux(video_in, audio_in):
            if packet.stream.index == audio_in.index:
                if packet.size:
                    if packet.dts is None:
                        packet.dts = packet.pts
                    packet.stream = audio_out
                    output.mux(packet)
                continue
            for frame in packet.decode():
                last = frame.reformat(format="yuv420p").to_ndarray()
                seen += 1
                if shift < 0 and seen <= -shift:
                    continue  # the picture moves earlier: its first frames go
                repeats = shift + 1 if (shift > 0 and seen == 1) else 1
                for _ in range(repeats):
                    emit(last)
        if last is None:
            raise InvalidInputError(f"{source}: no picture could be decoded")
        while emitted < info.frames:  # the picture moved earlier: the last frame repeats
            emit(last)
        output.mux(video_out.encode(None))
    return ShiftReport(final, offset_ms, "frames", frames=shift, sample_rate=info.sample_rate, fps=info.fps)


__all__ = ["ShiftReport", "shift_audio_file", "shift_video_file"]
