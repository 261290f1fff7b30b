"""Streaming, bounded-memory decode of a latent video: clip by clip, straight into a sink.

`stream_decode(adapter, latents, sink)` follows the adapter's `DecodeSchedule`
(`h3director.geometry`): it decodes one clip, cross-fades its body with the previous clip's tail
exactly as the references do (`h3director.video.crossfade`), hands the frames that are now final to
the sink, keeps only the new tail (a copy of a few frames) and drops the clip. Peak memory is one
clip's working set, one tail and the sink's own buffer, independent of the video's length; the
frames are the ones `vae.decode(z).sample` returns, bit for bit.

Out of memory: a clip that fails with an allocator error is retried, alone, after freeing cached
memory, with the adapter's next cheaper execution (fewer spatial tiles per decoder call, then the
CPU; when the adapter has none, the same execution once more); frames already handed to the sink and
the carried tail are untouched, and later clips keep the cheaper execution. Every retry is
listed in `DecodeReport.retries`. Before any decoding a preflight compares one clip's working set
and the sink's buffer with the budget and refuses with `BudgetError` when they cannot fit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from h3director.core.guard import free_caches
from h3director.errors import H3DirectorError, InvalidInputError
from h3director.geometry import ClipStep, DecodeSchedule
from h3director.video.clip_buffers import CARRIED, CLIP, BufferCounts, ClipBuffers
from h3director.video.crossfade import crossfade_parts
from h3director.video.decoder import ClipExecution, DecodeSession, VideoDecoderAdapter
from h3director.video.faults import STAGE_START, FaultInjector, FaultPoint, is_out_of_memory
from h3director.video.preflight import PreflightResult, preflight, resolve_budget
from h3director.video.sinks.contract import FrameSink, StreamSpec

ProgressCallback = Callable[[int, int], None]
"""Called as ``on_progress(frames_done, frames_total)`` each time frames are handed to the sink."""


class DecodeOutOfMemory(H3DirectorError):
    """A clip ran out of memory with every execution the adapter offers; nothing written is lost."""


@dataclass(frozen=True)
class ClipRetry:
    """One out-of-memory retry: clip index, the failed execution, the one retried with, the error text."""

    clip: int
    failed: ClipExecution
    retried_with: ClipExecution
    error: str


@dataclass
class AudioJob:
    """Audio to decode alongside the video and hand to the sink (`sink.write_audio`).

    `adapter` is an audio adapter from `h3director.integrations` (e.g. `H3AudioAdapter`) with
    `validate(latents, denormalize=)`, `decode(latents, denormalize=, chunk_seconds=)` returning
    `[B, channels, samples]` and `sample_rate`.
    """

    adapter: Any
    latents: torch.Tensor
    denormalize: bool = True
    chunk_seconds: float | None = None


@dataclass
class DecodeReport:
    """What a streaming decode did.

    `frames`: frames per batch item in the video; `clips`: clips in the schedule; `retries`: out-of-memory
    retries; `peak_bytes`: peak allocated bytes on an accelerator during the decode (None on the
    CPU, where the monitor's RSS is the measure); `seconds`: wall time; `result`: what
    `sink.finish()` returned; `execution`: the execution the last clip used; `preflight`: the
    estimate the decode started from; `audio_samples`: samples per channel written (0 without audio);
    `resumed_frames`: frames the sink already held from an interrupted run; `clips_decoded`: clips
    actually run (fewer than `clips` when resuming). `path`: "streaming" (clip by clip) or "reference"
    (the model's own whole-video decode, memory level 0; `h3director.video.levels`). `buffers`: the
    per-clip buffers' pool leases, fallbacks, plain allocations and between-clip collections
    (`h3director.video.clip_buffers.BufferCounts`, all 0 on the reference path). `notes`: what the
    decode chose and why, one line each.
    """

    frames: int
    clips: int
    retries: list[ClipRetry] = field(default_factory=list)
    peak_bytes: int | None = None
    seconds: float = 0.0
    result: Any = None
    execution: ClipExecution | None = None
    preflight: PreflightResult | None = None
    audio_samples: int = 0
    resumed_frames: int = 0
    clips_decoded: int = 0
    path: str = "streaming"
    buffers: BufferCounts = field(default_factory=BufferCounts)
    notes: list[str] = field(default_factory=list)


def _stream_spec(adapter: VideoDecoderAdapter, latents: torch.Tensor, schedule: DecodeSchedule) -> StreamSpec:
    height, width = adapter.output_size(latents.shape[-2], latents.shape[-1])
    return StreamSpec(batch=latents.shape[0], channels=adapter.out_channels, frames=schedule.frames,
                      height=height, width=width, fps=adapter.fps,
                      pixel_mean=adapter.pixel_mean, pixel_std=adapter.pixel_std)


def _decode_clip_with_retry(session: DecodeSession, adapter: VideoDecoderAdapter, clip: ClipStep,
                            execution: ClipExecution, retries: list[ClipRetry], *, oom_retry: bool,
                            fault_injector: FaultInjector | None) -> tuple[torch.Tensor, ClipExecution]:
    attempt = 0
    while True:
        checkpoint = None
        if fault_injector is not None:
            def checkpoint(stage: str, _attempt: int = attempt) -> None:
                fault_injector(FaultPoint(clip.index, _attempt, stage))
        try:
            if checkpoint is not None:
                checkpoint(STAGE_START)
            return session.decode_clip(clip, execution, checkpoint), execution
        except Exception as error:  # noqa: BLE001 - only allocator failures are handled, the rest re-raised
            if not is_out_of_memory(error):
                raise
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            free_caches(adapter.device)
            cheaper = adapter.cheaper(execution) if oom_retry else None
            if cheaper is None and oom_retry and attempt == 0:
                cheaper = execution   # nothing cheaper: once more after freeing the allocator's cache
            if cheaper is None:
                tried = [r.retried_with.describe() for r in retries if r.clip == clip.index]
                raise DecodeOutOfMemory(
                    f"clip {clip.index} (latent frames {clip.latent_start}..{clip.latent_stop - 1}) ran out of "
                    f"memory with {execution.describe()}"
                    + (f" after retries with {', '.join(tried)}" if tried else "")
                    + ("" if oom_retry else " (video_decode.oom_retry is off)")
                    + f"; {clip.out_start} frames were already written. Cause: {message}"
                ) from error
            retries.append(ClipRetry(clip=clip.index, failed=execution, retried_with=cheaper, error=message))
            execution = cheaper
            attempt += 1


def _stream_clips(session: DecodeSession, adapter: VideoDecoderAdapter, schedule: DecodeSchedule, sink: FrameSink,
                  execution: ClipExecution, report: DecodeReport, buffers: ClipBuffers, *, oom_retry: bool,
                  fault_injector: FaultInjector | None, on_progress: ProgressCallback | None) -> ClipExecution:
    """Decode the clips of `schedule`, cross-fade, and write the final frames; return the last execution.

    Clips whose frames the sink already holds from an interrupted run (`sink.resume_from()`) are
    skipped, except the one whose tail the first missing clip is cross-faded with. The clip output and
    the carried tail are `buffers`' (pool leases when it has a pool); `buffers.after_clip()` runs after
    each clip.
    """
    tail = None
    report.resumed_frames = done = min(sink.resume_from(), schedule.frames)
    first = schedule.first_clip_for(done)
    written = done
    for clip in schedule.clips[first:]:
        report.clips_decoded += 1
        decoded, execution = _decode_clip_with_retry(session, adapter, clip, execution, report.retries,
                                                     oom_retry=oom_retry, fault_injector=fault_injector)
        body = decoded[:, :, clip.body_start:clip.body_stop]
        # a clip retried on the CPU returns CPU frames; the blend is elementwise, so moving is exact
        parts = [body] if tail is None else crossfade_parts(tail.to(body.device), body, schedule.frame_overlap,
                                                            dim=2)
        tail = buffers.copy(decoded[:, :, clip.tail_start:clip.tail_stop], CARRIED) if clip.tail_length else None
        del decoded, body
        start, stop = schedule.final_range(clip)
        first_new = max(start, done)
        if stop > first_new:
            if tail is not None and stop > clip.out_stop:
                parts.append(tail)
            final = buffers.cat(parts, dim=2, generation=CLIP)
            sink.write(first_new, final[:, :, first_new - start:stop - start])
            written = stop
            del final
            if on_progress is not None:
                on_progress(written, schedule.frames)
        del parts
        buffers.after_clip()
    if written != schedule.frames:
        raise AssertionError(f"the schedule wrote {written} of {schedule.frames} frames")
    return execution


def check_decode_inputs(adapter: VideoDecoderAdapter, latents: torch.Tensor, sink: FrameSink,
                        audio: AudioJob | None, denormalize: bool) -> None:
    """Refuse a decode before any work: `latents` not a tensor or not what `adapter` decodes, `audio`
    latents its adapter refuses, or audio for a sink that does not take it (`InvalidInputError`)."""
    if not isinstance(latents, torch.Tensor):
        raise InvalidInputError(f"latents must be a torch.Tensor, got {type(latents).__name__}")
    adapter.validate(latents, denormalize=denormalize)
    if audio is not None:
        audio.adapter.validate(audio.latents, denormalize=audio.denormalize)
        if not sink.supports_audio:
            raise InvalidInputError(f"{type(sink).__name__} does not take audio; use a sink that does "
                                    f"(e.g. VideoFileSink) or decode the audio separately")


def write_audio_job(audio: AudioJob | None, sink: FrameSink, report: DecodeReport) -> None:
    """Decode `audio` (when given) in one call and hand the waveform to `sink`; `report.audio_samples`
    gets its length in samples. The waveform is dropped before returning."""
    if audio is None:
        return
    waveform = audio.adapter.decode(audio.latents, denormalize=audio.denormalize, chunk_seconds=audio.chunk_seconds)
    sink.write_audio(waveform, audio.adapter.sample_rate)
    report.audio_samples = waveform.shape[-1]
    del waveform


def clip_buffers_for(config: Any, device: torch.device | str) -> ClipBuffers:
    """The per-clip buffers `config`'s memory level asks for on `device`: the process-wide slot pool
    (`h3director.core.pool_registry`) when ``features().pool``, collections between clips when
    ``features().generation_gc``."""
    from h3director.core.pool_registry import process_pool

    features = config.features()
    pool = process_pool(config, device) if features.pool else None
    return ClipBuffers(pool, collect_between_clips=features.generation_gc)


def stream_decode(adapter: VideoDecoderAdapter, latents: torch.Tensor, sink: FrameSink, *,
                  budget_bytes: int | None = None, audio: AudioJob | None = None,
                  on_progress: ProgressCallback | None = None, fault_injector: FaultInjector | None = None,
                  denormalize: bool = True, tiles_per_call: int | None = None,
                  oom_retry: bool | None = None, config: Any = None,
                  buffers: ClipBuffers | None = None) -> DecodeReport:
    """Decode `latents` `[B, C, T, h, w]` clip by clip into `sink`; return a `DecodeReport`.

    `latents` are normalized as the sampler produces them; the adapter applies its
    `latents_std`/`latents_mean` unless `denormalize=False`. `budget_bytes` bounds the decoder
    device's working set (default: `memory_safety` from `h3_config.yaml`). `tiles_per_call`: see
    `ClipExecution` (None: the reference path, or the streamed one when only that fits the budget).
    `tiles_per_call` None and `oom_retry` None take `video_decode.tiles_per_call` / `.oom_retry` from
    `config` (an `H3Config`; default `load_config()`), which also supplies `memory_safety`. Process-wide
    settings are left alone: the director's CLI pins glibc's mmap threshold in its own process
    (`h3director.core.host_heap.pin_decode_threshold`) before calling this.
    `fault_injector` is called at each `FaultPoint` of each clip attempt (the tests'
    `OomOnClip` in `fixtures/oom_injection.py`).
    `buffers` serves the per-clip buffers; None builds them from `config`'s memory level
    (`clip_buffers_for`: the process-wide slot pool at level >= 1, collections between clips at >= 2).
    Raises `InvalidInputError` or `BudgetError` before any decoding, `DecodeOutOfMemory` when a clip
    cannot be decoded by any execution; the sink is aborted on every failure after `begin`.
    """
    check_decode_inputs(adapter, latents, sink, audio, denormalize)
    if config is None:
        from h3director.core.config import load_config

        config = load_config()
    if tiles_per_call is None:
        tiles_per_call = config.video_decode.tiles_per_call
    if oom_retry is None:
        oom_retry = config.video_decode.oom_retry
    if tiles_per_call is not None and (isinstance(tiles_per_call, bool) or int(tiles_per_call) < 1):
        raise InvalidInputError(f"tiles_per_call must be None or an integer >= 1, got {tiles_per_call!r}")
    schedule = adapter.schedule(latents.shape[2])
    spec = _stream_spec(adapter, latents, schedule)
    budget = resolve_budget(budget_bytes, adapter.device, config.memory_safety)
    checked = preflight(adapter, tuple(latents.shape), spec, sink, adapter.default_execution(tiles_per_call),
                        budget, tiles_per_call_given=tiles_per_call is not None)
    execution = checked.execution

    started = time.perf_counter()
    device = adapter.device
    track_peak = device.type == "cuda" and torch.cuda.is_available()
    if track_peak:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    if buffers is None:
        buffers = clip_buffers_for(config, device)
    report = DecodeReport(frames=schedule.frames, clips=len(schedule.clips), preflight=checked)
    session = adapter.open(latents, denormalize=denormalize)
    try:
        sink.begin(spec)
        try:
            write_audio_job(audio, sink, report)
            sink.use_buffers(buffers)
            execution = _stream_clips(session, adapter, schedule, sink, execution, report, buffers,
                                      oom_retry=oom_retry, fault_injector=fault_injector, on_progress=on_progress)
            report.result = sink.finish()
        except BaseException:
            sink.abort()
            raise
    finally:
        session.close()
    report.execution = execution
    report.buffers = buffers.counts()
    report.seconds = time.perf_counter() - started
    if track_peak:
        report.peak_bytes = torch.cuda.max_memory_allocated(device) - base
    return report


__all__ = ["AudioJob", "ClipRetry", "DecodeOutOfMemory", "DecodeReport", "ProgressCallback",
           "check_decode_inputs", "stream_decode", "write_audio_job"]
