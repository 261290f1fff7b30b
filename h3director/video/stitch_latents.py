"""Stitch chained segments before decoding: join their latents on the grid and stream one decode.

Video latents ``[B, 24, 5n+2, h, w]`` (17n+5 frames) sharing `overlap` frames (on the grid, 17m+5 frames =
5m+2 latent frames, `geometry.latent_frames_for`: 22 frames = 7 latent frames) are joined by keeping every
latent frame of the first segment and dropping the first ``5m+2`` latent frames of each later one: the later
segment's latent frame ``5m+2`` is its pixel frame ``17m+5`` (every encoder clip of 17 frames is 5 latent frames),
so the joined latents are ``sum(T) - (k - 1)(5m+2)`` frames, again on the grid, and decode to exactly
``sum(frames) - (k - 1) x overlap`` frames: a `cut` join in latent space. The decoder clip that straddles a
join sees latent frames of both segments, so frames near a join are the decoder's blend of the two (its own
5-frame cross-fade between clips), not a pixel cut; frames whose decoder clips lie inside one segment equal
that segment's own decode.

Audio latents (40 per second, time on the last axis, any leading layout) are cut at the same instant, the
overlap's end: output audio latent ``q`` comes from the segment that holds output frame ``q x fps / 40``,
placed from the segment's start (`timeline.sample_at` at 40 Hz, from absolute frames). A segment may miss one
audio latent at its end (rounding); its last one is repeated. `decode_stitched` streams the joined latents
through `h3director.video.scheduler.stream_decode`: memory is one decode's, whatever the number of segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import torch

from h3director import geometry
from h3director.av.timeline import check_chain, sample_at
from h3director.errors import InvalidInputError
from h3director.video.scheduler import AudioJob, stream_decode


def check_latent_chain(videos: Sequence[torch.Tensor], overlap: int) -> tuple[int, ...]:
    """Refuse video latents that cannot be joined (shapes, grid, overlap); return each segment's frame count."""
    if len(videos) < 2:
        raise InvalidInputError(f"stitching needs at least two segments, got {len(videos)}")
    if not geometry.is_on_grid(overlap):
        low, high = geometry.nearest_grid_frames(overlap)
        raise InvalidInputError(f"a latent join needs an overlap on the 17n+5 grid, got {overlap} (nearest: {low} or {high})")
    frames = []
    for i, z in enumerate(videos):
        if not isinstance(z, torch.Tensor) or z.dim() != 5:
            raise InvalidInputError(f"segment {i + 1}: video latents must be [B, C, T, h, w], got "
                                    f"{list(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}")
        if (z.shape[0], z.shape[1], *z.shape[3:]) != (videos[0].shape[0], videos[0].shape[1], *videos[0].shape[3:]):
            raise InvalidInputError(f"segment {i + 1}: latents {list(z.shape)} differ from segment 1's "
                                    f"{list(videos[0].shape)} outside the time axis")
        if z.shape[2] % 5 != 2:
            raise InvalidInputError(f"segment {i + 1}: {z.shape[2]} latent frames is off the 5n+2 grid")
        frames.append(geometry.frames_for_latents(z.shape[2]))
    check_chain(tuple(frames), overlap)
    return tuple(frames)


def join_latents(videos: Sequence[torch.Tensor], audios: Sequence[torch.Tensor] | None = None, overlap: int = 22,
                 fps: float = geometry.VIDEO_FPS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The joined video latents and (when `audios` is given) audio latents; see the module docstring.
    `InvalidInputError` (from `check_latent_chain` for the video) for latents that cannot be joined:
    counts, shapes or too few audio latent frames for the join."""
    frames = check_latent_chain(videos, overlap)
    drop = geometry.latent_frames_for(overlap)
    video = torch.cat([videos[0], *(z[:, :, drop:] for z in videos[1:])], dim=2)
    if audios is None:
        return video, None
    if len(audios) != len(videos):
        raise InvalidInputError(f"{len(videos)} video latents but {len(audios)} audio latents")
    for i, a in enumerate(audios):
        if a.shape[:-1] != audios[0].shape[:-1]:
            raise InvalidInputError(f"segment {i + 1}: audio latents {list(a.shape)} differ from segment 1's "
                                    f"{list(audios[0].shape)} outside the time axis")
    rate = Fraction(fps).limit_denominator(1001)
    per_second = geometry.AUDIO_LATENTS_PER_SECOND
    starts, at = [], 0
    for length in frames:
        starts.append(at)
        at += length - overlap
    total = sample_at(at + overlap, rate, per_second)
    pieces = []
    for i, a in enumerate(audios):
        begin = 0 if i == 0 else sample_at(starts[i] + overlap, rate, per_second)
        end = total if i == len(audios) - 1 else sample_at(starts[i + 1] + overlap, rate, per_second)
        origin = sample_at(starts[i], rate, per_second)
        lo, hi = begin - origin, end - origin
        if hi > a.shape[-1] + 1:
            raise InvalidInputError(f"segment {i + 1}: {a.shape[-1]} audio latent frames, the join needs {hi} "
                                    f"({frames[i]} frames at {float(rate):g} fps)")
        piece = a[..., lo:min(hi, a.shape[-1])]
        if hi > a.shape[-1]:
            piece = torch.cat([piece, a[..., -1:]], dim=-1)
        pieces.append(piece)
    return video, torch.cat(pieces, dim=-1)


def decode_stitched(adapter, videos: Sequence[torch.Tensor], sink, *, audios: Sequence[torch.Tensor] | None = None,
                    audio_adapter=None, overlap: int = 22, fps: float = geometry.VIDEO_FPS, **decode_kwargs):
    """Join the segments' latents (`join_latents`) and decode them once with `stream_decode` into `sink`.
    `InvalidInputError` for audio latents without an audio adapter or the reverse.

    `adapter`/`audio_adapter` are the video and audio decoder adapters `stream_decode` takes; `decode_kwargs`
    go to `stream_decode` (budget, config, progress). Returns its `DecodeReport`."""
    if (audios is None) != (audio_adapter is None):
        raise InvalidInputError("audio latents and an audio adapter go together: give both or neither")
    video, audio = join_latents(videos, audios, overlap, fps)
    job = AudioJob(adapter=audio_adapter, latents=audio) if audio is not None else None
    return stream_decode(adapter, video, sink, audio=job, **decode_kwargs)


__all__ = ["check_latent_chain", "decode_stitched", "join_latents"]
