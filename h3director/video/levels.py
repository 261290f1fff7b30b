"""The decode a memory level asks for: the model's own path at level 0, the streaming decode above.

`decode_for_level(adapter, latents, sink, config=...)` is what the CLI (`h3director decode`) and
the node pack's decode node call:

- level 0 (``features().streaming_decode`` off): the director changes nothing. The adapter's
  `reference_decode` (the model's whole-video decode, e.g. ``vae.decode(z).sample``) runs once and
  all frames go to the sink in one write; no pool, no collections, no budget preflight. An adapter
  without a reference call is streamed, and the report's notes say so.
- level >= 1: `stream_decode`, with per-clip buffers from the process-wide slot pool when
  ``pre_allocated_pool_mb`` > 0, and (level >= 2) a young collection between clips.

Both paths give the same frames bit for bit (`tests/test_decode_levels.py` on the real diffusers H3
VAE); they differ in peak memory (the reference holds the whole video in the decoder's dtype).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from h3director.video.decoder import VideoDecoderAdapter
from h3director.video.scheduler import (
    AudioJob,
    DecodeReport,
    ProgressCallback,
    check_decode_inputs,
    stream_decode,
    write_audio_job,
)
from h3director.video.sinks.contract import FrameSink, StreamSpec

REFERENCE_NOTE = "memory_optimization_level 0: the model's own decode (reference path), no streaming, no pool"


def reference_decode(adapter: VideoDecoderAdapter, latents: torch.Tensor, sink: FrameSink, *,
                     audio: AudioJob | None = None, denormalize: bool = True,
                     on_progress: ProgressCallback | None = None) -> DecodeReport | None:
    """Decode the whole video with `adapter.reference_decode` into `sink`; None when the adapter has no
    reference call (nothing was started then)."""
    check_decode_inputs(adapter, latents, sink, audio, denormalize)
    started = time.perf_counter()
    frames = adapter.reference_decode(latents, denormalize=denormalize)
    if frames is None:
        return None
    height, width = frames.shape[-2], frames.shape[-1]
    spec = StreamSpec(batch=frames.shape[0], channels=frames.shape[1], frames=frames.shape[2], height=height,
                      width=width, fps=adapter.fps, pixel_mean=adapter.pixel_mean, pixel_std=adapter.pixel_std)
    report = DecodeReport(frames=spec.frames, clips=1, path="reference", notes=[REFERENCE_NOTE])
    sink.begin(spec)
    try:
        write_audio_job(audio, sink, report)
        sink.write(0, frames)
        del frames
        if on_progress is not None:
            on_progress(spec.frames, spec.frames)
        report.result = sink.finish()
    except BaseException:
        sink.abort()
        raise
    report.clips_decoded = 1
    report.seconds = time.perf_counter() - started
    return report


def decode_for_level(adapter: VideoDecoderAdapter, latents: torch.Tensor, sink: FrameSink, *,
                     config: Any = None, **kwargs: Any) -> DecodeReport:
    """The decode `config`'s memory level asks for (see the module docstring); `kwargs` go to
    `stream_decode` (``audio``, ``denormalize`` and ``on_progress`` also to the reference path)."""
    if config is None:
        from h3director.core.config import load_config

        config = load_config()
    if not config.features().streaming_decode:
        report = reference_decode(adapter, latents, sink, audio=kwargs.get("audio"),
                                  denormalize=kwargs.get("denormalize", True),
                                  on_progress=kwargs.get("on_progress"))
        if report is not None:
            return report
        report = stream_decode(adapter, latents, sink, config=config, **kwargs)
        report.notes.append(f"memory_optimization_level 0, but {adapter.name} has no whole-video reference "
                            "decode: streamed clip by clip (no pool, no collections)")
        return report
    report = stream_decode(adapter, latents, sink, config=config, **kwargs)
    report.notes.append(describe_buffers(report))
    return report


def describe_buffers(report: DecodeReport) -> str:
    """One line on the streaming decode's buffers: pool leases, fallbacks, collections and what they reclaimed."""
    counts = report.buffers
    return (f"streaming decode: {counts.pool_leases} pool lease(s), {counts.pool_fallbacks} pool fallback(s), "
            f"{counts.unpooled} plain allocation(s), {counts.collections} collection(s) between clips "
            f"(reclaimed {counts.reclaimed_leases} lease(s), {counts.reclaimed_bytes} bytes)")


__all__ = ["REFERENCE_NOTE", "decode_for_level", "describe_buffers"]
