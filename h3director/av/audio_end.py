"""Exact sound length in lossy audio files: the encoder's end padding, signalled so that decoders drop it.

An AAC encoder codes whole 1024-sample frames (plus 1024 samples of priming at the start); FFmpeg's decoder returns
whole frames. The priming is signalled by every container FFmpeg writes (the MP4 edit list's start, Matroska's
negative start) and FFmpeg drops it. The end padding (the last frame's samples beyond the sound) is signalled here:

- Matroska: `mark_end_padding` attaches FFmpeg's `skip_samples` side data to the last packet; the muxer writes it
  as the block's DiscardPadding and FFmpeg's decoder (PyAV included) returns exactly the encoded samples.
- MP4 / MOV: the file cannot carry per-packet padding; the edit list states the track's exact length when the
  movie timescale counts whole samples (`movie_timescale`). Players that honour edit lists (QuickTime / AVFoundation,
  h3director's `SampleReader`) stop there; FFmpeg's decoder (PyAV) returns the padding samples too (measured with
  FFmpeg 8.1: it trims the edit list's start, not its end).
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

TRIMS_END_IN_DECODER = ("matroska",)
"""Container formats whose end padding FFmpeg's decoder itself drops (DiscardPadding)."""


def movie_timescale(sample_rate: int, fps: Fraction) -> int:
    """A movie timescale (ticks per second) in which both one audio sample and one video frame are whole numbers
    of ticks, so the MP4 edit lists state both tracks' lengths exactly: ``lcm(sample_rate, fps.numerator)``, or
    the sample rate alone when that exceeds MP4's 32-bit field."""
    scale = math.lcm(int(sample_rate), int(Fraction(fps).numerator))
    return scale if scale < 2**31 else int(sample_rate)


def exact_length_options(container_format: str, sample_rate: int, fps) -> dict[str, str]:
    """Muxer options for a file of `container_format` (FFmpeg's name) with sound at `sample_rate` (Hz) beside video at
    `fps` (frames per second, a Fraction or a float read from a file: limited to denominators up to 1001): MP4 and
    MOV get the `movie_timescale` that states both tracks' lengths exactly (at FFmpeg's default of 1,000 ticks a
    second the edit list rounds the sound to whole milliseconds); Matroska needs none (`mark_end_padding` carries
    the end)."""
    if container_format in TRIMS_END_IN_DECODER:
        return {}
    return {"movie_timescale": str(movie_timescale(sample_rate, Fraction(fps).limit_denominator(1001)))}


def flush_encoder(stream) -> tuple[list, int]:
    """Drain an audio output `stream`'s encoder (``stream.encode(None)``), its last packet's end padding marked
    (`mark_end_padding`). Returns (the packets, to mux; the padding in samples)."""
    packets = stream.encode(None)
    context = stream.codec_context
    return packets, mark_end_padding(packets, context.frame_size, context.sample_rate)


def mark_end_padding(packets, frame_size: int, sample_rate: int) -> int:
    """Mark the end padding of the last of `packets` (the encoder's flush output, in order) and return it in samples.

    `frame_size`: the encoder's samples per frame (``codec_context.frame_size``, 1024 for AAC). The padding is
    ``frame_size`` minus the last packet's duration (the encoder sets it to the samples it really holds); it is
    attached as `skip_samples` side data (start 0, end = padding). Returns 0 when there is no packet, the codec has
    no fixed frame size or the last frame is full."""
    if not packets or not frame_size:
        return 0
    last = packets[-1]
    if not last.duration or last.time_base is None:
        return 0
    held = round(last.duration * last.time_base * sample_rate)
    padding = int(frame_size) - held
    if padding <= 0:
        return 0
    from av.packet import PacketSideData, packet_sidedata_type_from_literal

    side = PacketSideData(packet_sidedata_type_from_literal("skip_samples"), 10)
    memoryview(side)[:] = struct.pack("<IIBB", 0, padding, 0, 0)   # skip at start, discard at end, reasons
    last.set_sidedata(side)
    return padding


__all__ = ["TRIMS_END_IN_DECODER", "exact_length_options", "flush_encoder", "mark_end_padding", "movie_timescale"]
