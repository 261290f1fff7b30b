"""Staged generation: price a video-only draft (stage one) and its full-size audio-video refinement (stage two).

Stage one samples the prompt at a small size and a low frame rate with no audio rows (`PlanRequest.audio_rows`
False: ComfyUI's H3 DiT accepts an AV latent with 0 audio latent frames, `H3DirectorVideoOnlyLatent`). Its
latent is saved (SaveLatent of `H3DirectorVideoStream`). Stage two loads it, resizes it to the final latent
grid (`H3DirectorDraftToAV`), attaches the final length's audio stream and samples that at `denoise` < 1 with
the full prompt: a hires-fix-style re-noise and refine at full size, with audio.

What this buys, and what it does not: stage two's packed sequence is exactly a single-pass generation's (same
rows: text, audio, video at the final size), so its peak is the single pass's peak; staging never lowers the
memory needed for the final video. Stage one is cheap (fewer rows, no audio VAE), so drafts can be iterated on a
small budget, and stage two runs ``round(steps * denoise)`` of its steps.

Draft length: the final video's seconds at `draft_fps`, snapped to the nearest 17n+5 count (the sampler's grid),
so the draft plays at ``draft_frames / seconds`` frames per second (`StagedPlan.draft_fps_actual`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from h3director import geometry
from h3director.errors import InvalidInputError
from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.recommend import Budget, Recommendation, recommend
from h3director.units import format_size

DEFAULT_DRAFT_AREA = 512 * 512      # pixels: the draft canvas keeps the final aspect ratio within this area
DEFAULT_DRAFT_FPS = 12.0
DEFAULT_DENOISE = 0.6


def parse_size(text: str) -> tuple[int, int]:
    """"WxH" -> (width, height); `InvalidInputError` for anything else."""
    parts = text.lower().replace(" ", "").split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise InvalidInputError(f"--draft must be WIDTHxHEIGHT in pixels, e.g. 512x512, got {text!r}")
    return int(parts[0]), int(parts[1])


def default_draft_size(width: int, height: int, area: int = DEFAULT_DRAFT_AREA) -> tuple[int, int]:
    """The final canvas scaled to at most `area` pixels (never up), each side a multiple of 32 (>= 32)."""
    scale = min(1.0, math.sqrt(area / (width * height)))
    stride = geometry.TOKEN_STRIDE
    return (max(stride, int(width * scale) // stride * stride), max(stride, int(height * scale) // stride * stride))


def draft_frames_for(frames: int, fps: float) -> int:
    """Frames of a draft covering the seconds of `frames` at 24 fps, played at `fps`: the nearest 17n+5 count
    (the longer one on a tie), at least 5."""
    wanted = frames * fps / geometry.VIDEO_FPS
    low, high = geometry.nearest_grid_frames(max(5, round(wanted)))
    return max(5, low if wanted - low < high - wanted else high)


@dataclass(frozen=True)
class StagedPlan:
    """The two stages' recommendations. `draft`: the video-only draft (its request has ``audio_rows`` False);
    `final`: the full-size audio-video pass, which is what stage two runs (same packed rows) at `denoise`."""

    draft: Recommendation
    final: Recommendation
    draft_fps: float
    denoise: float

    @property
    def seconds(self) -> float:
        return self.final.request.frames / geometry.VIDEO_FPS

    @property
    def draft_fps_actual(self) -> float:
        """Frames per second the draft plays at (its grid-snapped frame count over the final's seconds)."""
        return self.draft.request.frames / self.seconds

    def to_dict(self) -> dict:
        def stage(rec: Recommendation) -> dict:
            out = rec.to_dict()
            out["request"] = {k: v for k, v in dataclasses.asdict(rec.request).items() if not k.endswith("_config")}
            out["packed_tokens"] = rec.estimate.geometry.packed_tokens
            out["phases"] = rec.estimate.to_dict()["phases"]
            return out

        work, floor = self.sampling_working_bytes(), self.smallest_device_bytes()
        return {"draft": dict(stage(self.draft), sampling_working_bytes=work[0], smallest_device_bytes=floor[0]),
                "final": dict(stage(self.final), sampling_working_bytes=work[1], smallest_device_bytes=floor[1]),
                "draft_fps": self.draft_fps, "draft_fps_actual": self.draft_fps_actual, "denoise": self.denoise}

    def sampling_working_bytes(self) -> tuple[int, int]:
        """(draft, final) sampling working set on the device, bytes: the activations the draft saves."""
        return tuple(_phase(rec.estimate, "sampling").working_bytes for rec in (self.draft, self.final))

    def smallest_device_bytes(self) -> tuple[int, int]:
        """(draft, final) device need of the sampling phase with every DiT block offloaded and the most
        chunking (the floor of each stage's peak, in the recommended weights format), bytes."""
        from h3director.plan.activations import DiTShape
        from h3director.plan.recommend import chunkings

        out = []
        for rec in (self.draft, self.final):
            shape = DiTShape.from_config(rec.request.dit_config)
            heads, ffn = chunkings(shape.heads, rec.request.weights, rec.request.target)[-1]
            floor = estimate(dataclasses.replace(rec.request, offload_blocks=shape.layers, head_chunks=heads,
                                                 ffn_chunks=ffn))
            out.append(_phase(floor, "sampling").device_bytes)
        return tuple(out)

    def summary(self) -> str:
        d, f = self.draft, self.final
        dg, fg = d.estimate.geometry, f.estimate.geometry
        (d_work, f_work), (d_floor, f_floor) = self.sampling_working_bytes(), self.smallest_device_bytes()
        lines = [
            f"Stage one (video-only draft): {d.request.width}x{d.request.height}, {d.request.frames} frames "
            f"({self.draft_fps_actual:.2f} fps over the final's {self.seconds:.2f} s), no audio rows: "
            f"{dg.packed_tokens:,} packed tokens ({dg.packed_tokens / fg.packed_tokens:.1%} of the final's "
            f"{fg.packed_tokens:,})",
            f"  needs: device {format_size(d.estimate.peak_device_bytes)}, host {format_size(d.estimate.peak_host_bytes)}"
            f" with {_settings_line(d)}",
            f"Stage two (refine at full size with audio, denoise {self.denoise}): {f.request.width}x"
            f"{f.request.height}, {f.request.frames} frames, {fg.packed_tokens:,} packed tokens (a single pass's)",
            f"  needs: device {format_size(f.estimate.peak_device_bytes)}, host {format_size(f.estimate.peak_host_bytes)}"
            f" with {_settings_line(f)}",
            f"Sampling activations: draft {format_size(d_work)}, final {format_size(f_work)}; the smallest device need "
            f"(every DiT block offloaded, most chunking, DiT {f.request.weights}): draft {format_size(d_floor)}, "
            f"final {format_size(f_floor)}.",
            "Staging does not lower the final video's peak: stage two samples the same packed sequence as a single "
            "pass. It makes drafts cheap to iterate and runs stage two's steps at the given denoise only.",
        ]
        if abs(math.log((d.request.width / d.request.height) / (f.request.width / f.request.height))) > 0.05:
            lines.append(f"note: the draft's aspect ratio ({d.request.width}x{d.request.height}) is not the final's "
                         f"({f.request.width}x{f.request.height}): stage two stretches the draft onto the final canvas")
        return "\n".join(lines)


def _phase(plan, name: str):
    return next(p for p in plan.phases if p.name == name)


def _settings_line(rec: Recommendation) -> str:
    r = rec.request
    return (f"DiT {r.weights}, {r.head_chunks} head / {r.ffn_chunks} FFN chunks, {r.offload_blocks} blocks "
            f"offloaded, text encoder {r.text_encoder_weights} on {r.text_encoder_device}")


def plan_staged(request: PlanRequest, budget: Budget, *, draft_size: tuple[int, int] | None = None,
                draft_fps: float = DEFAULT_DRAFT_FPS, denoise: float = DEFAULT_DENOISE,
                formats: Sequence[str] | None = None) -> StagedPlan:
    """Recommend settings for both stages of `request` (the final video) within `budget`. Returns the
    `StagedPlan`.

    `draft_size`: (width, height) of the draft, default `default_draft_size`; `draft_fps`: its frame rate
    (0 < fps <= 24); `denoise`: stage two's KSampler denoise, in (0, 1). The draft uses the final's DiT weights
    format (one DiT file serves both stages). Raises `InvalidInputError` for a draft larger than the final video
    (naming both) or values out of range, `BudgetError` when a stage fits no setting, and refuses a plan whose
    final pass needs long-form chunks (a chain has no single latent to refine)."""
    request.validate()
    width, height = draft_size or default_draft_size(request.width, request.height)
    if not 0 < draft_fps <= geometry.VIDEO_FPS:
        raise InvalidInputError(f"--draft-fps must be in (0, {geometry.VIDEO_FPS}], got {draft_fps}")
    if not 0 < denoise < 1:
        raise InvalidInputError(f"stage two's denoise must be in (0, 1), got {denoise}")
    if width > request.width or height > request.height:
        raise InvalidInputError(f"the draft {width}x{height} is larger than the final video "
                                f"{request.width}x{request.height}: a draft must not exceed it in either side")
    frames = draft_frames_for(request.frames, draft_fps)
    final = recommend(request, budget, formats=formats)
    if final.long_form is not None:
        raise InvalidInputError(f"the final {request.frames} frames need {final.long_form.chunks} long-form "
                                "segments on this budget; staged generation refines one latent: shorten the video "
                                "or give more memory")
    draft_request = dataclasses.replace(request, width=width, height=height, frames=frames, audio=False,
                                        audio_rows=False)
    draft_request.validate()
    draft = recommend(draft_request, budget, formats=[final.request.weights])
    if draft.long_form is not None:          # cannot happen for a draft no larger than a final that fits
        raise InvalidInputError("the draft does not fit in one pass")
    return StagedPlan(draft=draft, final=final, draft_fps=draft_fps, denoise=denoise)


__all__ = ["DEFAULT_DENOISE", "DEFAULT_DRAFT_FPS", "StagedPlan", "default_draft_size", "draft_frames_for",
           "parse_size", "plan_staged"]
