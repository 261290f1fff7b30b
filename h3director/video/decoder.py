"""The interface between the streaming scheduler and a video decoder (implemented in `integrations/`).

The scheduler knows clips, frames and bytes; an adapter knows its model. An adapter declares

- its temporal plan: `schedule(latent_frames)` -> `h3director.geometry.DecodeSchedule` (which
  latent slice each clip decodes, which decoded frames are final, cross-fades, trim);
- its output geometry and pixel convention (`output_size`, `out_channels`, `pixel_mean/std`, `fps`);
- the executions it can run a clip with (`ClipExecution`) and the ladder of cheaper ones used after
  an out-of-memory error (`cheaper`), each documented as bit-identical or not;
- a per-clip working-set estimate in bytes (`clip_working_set_bytes`) for the preflight.

`open(latents, denormalize=...)` returns a `DecodeSession` that decodes one clip at a time.
A session is transactional per clip: when `decode_clip` raises, the session's state (for causal
decoders, the feature cache) is as it was before the call, so the clip can be retried.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from h3director.geometry import ClipStep, DecodeSchedule

Checkpoint = Callable[[str], None]
"""Called by a session with a stage name (`h3director.video.faults.STAGE_MID`) inside a clip attempt."""


@dataclass(frozen=True)
class ClipExecution:
    """How an adapter runs one clip.

    `tiles_per_call`: None = the reference's own code path; an int = the adapter's streamed spatial
    tiling with that many tiles per decoder call (1 = least memory). `device`: None = where the
    model lives; "cpu" = run this clip on the CPU (last resort).
    """

    tiles_per_call: int | None = None
    device: str | None = None

    def describe(self) -> str:
        """Short human text, e.g. ``"reference tiling"`` or ``"1 tile/call on cpu"``."""
        text = "reference path" if self.tiles_per_call is None else f"{self.tiles_per_call} tile(s)/call"
        return text + (f" on {self.device}" if self.device else "")


class DecodeSession(ABC):
    """Decodes the clips of one latent video. Created by `VideoDecoderAdapter.open`."""

    @abstractmethod
    def decode_clip(self, clip: ClipStep, execution: ClipExecution,
                    checkpoint: Checkpoint | None = None) -> torch.Tensor:
        """Decoded frames of `clip`, `[B, C, clip.latent_length * temporal_ratio, H, W]` in the decoder's
        pixel space, on the model's device. Calls `checkpoint` (if given) with stage "mid" after the
        first decoder call. On an exception the session is unchanged."""

    @abstractmethod
    def close(self) -> None:
        """Release per-video state (caches, prepared latents); called once, after the last clip or a failure."""


class VideoDecoderAdapter(ABC):
    """A video decoder as the streaming scheduler sees it (see the module docstring)."""

    name: str = "decoder"
    out_channels: int = 3
    fps: float = 24.0
    pixel_mean: tuple[float, ...] | None = None
    pixel_std: tuple[float, ...] | None = None

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the model's decoder weights live."""

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype:
        """The dtype the decoder computes in (and returns)."""

    @abstractmethod
    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        """Raise `InvalidInputError` naming what was expected and what came; cheap, no decoding."""

    @abstractmethod
    def schedule(self, latent_frames: int) -> DecodeSchedule:
        """The temporal plan for `latent_frames` latent frames."""

    @abstractmethod
    def output_size(self, latent_height: int, latent_width: int) -> tuple[int, int]:
        """Decoded `(height, width)` in pixels."""

    @abstractmethod
    def open(self, latents: torch.Tensor, *, denormalize: bool = True) -> DecodeSession:
        """Prepare a validated latent video `[B, C, T, h, w]` (denormalize, pad, cast) for decoding."""

    @abstractmethod
    def clip_working_set_bytes(self, batch: int, latent_height: int, latent_width: int,
                               execution: ClipExecution) -> int:
        """Estimated peak bytes one clip needs on the model's device beyond the weights."""

    def reference_decode(self, latents: torch.Tensor, *, denormalize: bool = True) -> torch.Tensor | None:
        """The model's own whole-video decode of validated `latents` (what its pipeline calls), frames
        `[B, C, F, H, W]` in the decoder's pixel space; None when the adapter offers none. Used at
        memory level 0 (`h3director.video.levels`), where the director changes nothing."""
        return None

    def default_execution(self, tiles_per_call: int | None = None) -> ClipExecution:
        """The execution clips start with (`tiles_per_call` from `video_decode.tiles_per_call`)."""
        return ClipExecution(tiles_per_call=tiles_per_call)

    def cheaper(self, execution: ClipExecution) -> ClipExecution | None:
        """The next cheaper execution after an out-of-memory error, or None when none is left."""
        return None


__all__ = ["Checkpoint", "ClipExecution", "DecodeSession", "VideoDecoderAdapter"]
