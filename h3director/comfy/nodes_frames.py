"""H3Director Frame Offset: shift IMAGE frames by N (clamped at the ends) and audio by the same time."""

from __future__ import annotations

import torch
from comfy_api.latest import io

from h3director.errors import InvalidInputError


def shift_frames(images: torch.Tensor, offset: int) -> torch.Tensor:
    """Frame i of the result is frame ``clamp(i - offset, 0, F - 1)`` of `images` `[F, H, W, C]`.

    A positive offset delays the video (the first frame repeats), a negative one advances it (the
    last frame repeats); the frame count is unchanged.
    """
    if images.ndim != 4:
        raise InvalidInputError(f"IMAGE must be [frames, H, W, C], got shape {list(images.shape)}")
    count = images.shape[0]
    index = (torch.arange(count) - int(offset)).clamp_(0, count - 1)
    return images.index_select(0, index.to(images.device))


def shift_audio(waveform: torch.Tensor, samples: int) -> torch.Tensor:
    """Shift `[B, channels, L]` by `samples` (positive = later), filling the gap with silence; length kept."""
    if waveform.ndim != 3:
        raise InvalidInputError(f"AUDIO waveform must be [B, channels, samples], got shape {list(waveform.shape)}")
    length = waveform.shape[-1]
    out = torch.zeros_like(waveform)
    if abs(samples) >= length:
        return out
    if samples >= 0:
        out[..., samples:] = waveform[..., :length - samples]
    else:
        out[..., :length + samples] = waveform[..., -samples:]
    return out


def audio_samples_for_frames(frames: int, fps: float, sample_rate: int) -> int:
    """Samples covering `frames` video frames at `fps`, rounded to the nearest sample."""
    return int(round(frames * sample_rate / fps))


class FrameOffset(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorFrameOffset",
            display_name="H3Director Frame Offset",
            category="H3 Director/frames",
            description="Shifts frames by `offset` (positive = later; the end frames repeat) and the audio by "
                        "offset / fps seconds (silence fills the gap). Frame and sample counts are unchanged.",
            inputs=[
                io.Image.Input("images"),
                io.Int.Input("offset", default=0, min=-4096, max=4096),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=1.0),
                io.Audio.Input("audio", optional=True),
            ],
            outputs=[io.Image.Output(display_name="images"), io.Audio.Output(display_name="audio")],
        )

    @classmethod
    def execute(cls, images, offset, fps, audio=None) -> io.NodeOutput:
        shifted = shift_frames(images, offset)
        if audio is None:
            return io.NodeOutput(shifted, None)
        if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
            raise InvalidInputError("AUDIO must be a dict with 'waveform' and 'sample_rate'")
        samples = audio_samples_for_frames(offset, fps, int(audio["sample_rate"]))
        return io.NodeOutput(shifted, {**audio, "waveform": shift_audio(audio["waveform"], samples)})
