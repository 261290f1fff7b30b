"""Stitch two in-memory segments (a ComfyUI IMAGE and AUDIO pair each) by the rules of `h3director.av.stitch`.

For node graphs, where segments are tensors: `join_frames(a, b, overlap, blend)` on ``[frames, H, W, C]`` float
pixels and `join_audio(...)` on ``[batch, channels, samples]`` float waveforms. Chaining k segments is k-1 pairwise
joins with the running result as `a`; the positions are the same as one k-segment `stitch_files` call because
every instant is computed from the absolute output frame (`timeline.sample_at`): `b` starts at frame
``len(a) - overlap``, its audio at ``sample_at(len(a) - overlap)``, the cross-fade (`timeline.fade_gains`) ends at
``sample_at(len(a))``, and the result's audio is ``sample_at(len(a) + len(b) - overlap)`` samples long. Crossfaded
frames are ``(1 - w) a + w b`` with ``w = (j + 1) / (overlap + 1)`` on overlap frame j, in float (no rounding).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from h3director.av.timeline import check_chain, fade_gains, sample_at, video_weight
from h3director.errors import InvalidInputError


def join_frames(a: torch.Tensor, b: torch.Tensor, overlap: int, blend: str = "crossfade") -> torch.Tensor:
    """`a` then `b` sharing `overlap` frames: ``len(a) + len(b) - overlap`` frames ``[F, H, W, C]``.
    `InvalidInputError` for a segment that is not ``[frames, H, W, C]``, segments of different sizes, or a
    `blend` other than "cut" or "crossfade"."""
    for name, images in (("a", a), ("b", b)):
        if images.ndim != 4:
            raise InvalidInputError(f"images_{name} must be [frames, H, W, C], got shape {list(images.shape)}")
    if a.shape[1:] != b.shape[1:]:
        raise InvalidInputError(f"segments differ in size: {list(a.shape[1:])} then {list(b.shape[1:])} "
                                "([H, W, C]); both must match")
    if blend not in ("cut", "crossfade"):
        raise InvalidInputError(f"blend must be cut or crossfade, got {blend!r}")
    check_chain((a.shape[0], b.shape[0]), overlap)
    if blend == "cut" or overlap == 0:
        return torch.cat([a, b[overlap:].to(a.dtype)])
    w = torch.tensor([video_weight(j, overlap) for j in range(overlap)], dtype=torch.float32).view(-1, 1, 1, 1)
    tail, head = a[a.shape[0] - overlap:].float(), b[:overlap].float()
    mixed = (tail * (1 - w.to(a.device)) + head.to(a.device) * w.to(a.device)).to(a.dtype)
    return torch.cat([a[:a.shape[0] - overlap], mixed, b[overlap:].to(a.dtype)])


def join_audio(a: torch.Tensor, b: torch.Tensor, rate: int, fps: float, frames_a: int, frames_b: int,
               overlap: int) -> torch.Tensor:
    """`a`'s soundtrack then `b`'s, `b` placed at the overlap's first frame with a cross-fade over the overlap
    (linear where the two overlapping soundtracks are correlated, else equal power: `timeline.fade_gains`); ``sample_at(frames_a + frames_b - overlap)`` samples. A soundtrack may miss up to one frame of
    samples at its end (silence is used); more is refused."""
    for name, wave in (("a", a), ("b", b)):
        if wave.ndim != 3:
            raise InvalidInputError(f"audio_{name} waveform must be [batch, channels, samples], got {list(wave.shape)}")
    if a.shape[:2] != b.shape[:2]:
        raise InvalidInputError(f"audio channels differ: {a.shape[1]} then {b.shape[1]} (batch {a.shape[0]}, "
                                f"{b.shape[0]}); both must match")
    frame_rate = Fraction(fps).limit_denominator(1001)
    join = sample_at(frames_a - overlap, frame_rate, rate)
    end = sample_at(frames_a, frame_rate, rate)
    total = sample_at(frames_a + frames_b - overlap, frame_rate, rate)
    one_frame = math.ceil(rate / frame_rate)
    for name, wave, need in (("a", a, end), ("b", b, total - join)):
        if need - wave.shape[-1] > one_frame:
            raise InvalidInputError(f"audio_{name} has {wave.shape[-1]} samples; the join needs {need} "
                                    f"({rate} Hz at {float(frame_rate):g} fps): more than one frame is missing")
    out = torch.zeros(a.shape[0], a.shape[1], total, dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
    first = a[..., :min(join, a.shape[-1])]
    out[..., :first.shape[-1]] = first
    length = end - join
    if length:
        seg_a = torch.zeros(a.shape[0], a.shape[1], length, dtype=torch.float64)
        seg_b = torch.zeros_like(seg_a)
        piece_a, piece_b = a[..., join:end], b[..., :length]
        seg_a[..., :piece_a.shape[-1]] = piece_a.double().cpu()
        seg_b[..., :piece_b.shape[-1]] = piece_b.double().cpu()
        gains_a, gains_b, _ = fade_gains(seg_a.numpy(), seg_b.numpy())
        mixed = seg_a * torch.from_numpy(gains_a) + seg_b * torch.from_numpy(gains_b)
        out[..., join:end] = mixed.to(out.dtype).to(out.device)
    rest = b[..., length:total - join]
    out[..., end:end + rest.shape[-1]] = rest.to(out.device, out.dtype)
    return out


__all__ = ["join_audio", "join_frames"]
