"""H3Director Frame Offset: move the picture against the sound (by whole frames) or the sound against the
picture (by milliseconds, rounded to whole samples); frame and sample counts unchanged.

Picture later by N frames: the first frame repeats N times at the start, the last N frames are dropped;
picture earlier: the first N frames are dropped, the last frame repeats N times at the end. Sound later:
silence at the start, the last samples dropped; sound earlier: the first samples dropped, silence at the
end. The two moves are independent: the picture's move leaves the sound untouched and vice versa.
"""

from __future__ import annotations

import torch
from comfy_api.latest import io

from h3director.comfy.audio_input import audio_input
from h3director.errors import InvalidInputError


def shift_frames(images: torch.Tensor, offset: int) -> torch.Tensor:
    """Frame i of the result is frame ``clamp(i - offset, 0, F - 1)`` of `images` `[F, H, W, C]`.

    A positive offset delays the video (the first frame repeats at the start, the last `offset`
    frames are dropped), a negative one advances it (the first frames are dropped, the last frame
    repeats at the end); the frame count is unchanged.
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


def audio_samples_for_ms(milliseconds: float, sample_rate: int) -> int:
    """Samples covering `milliseconds` at `sample_rate`, rounded to the nearest sample."""
    return int(round(float(milliseconds) * sample_rate / 1000.0))


class FrameOffset(io.ComfyNode):
    """Node `H3DirectorFrameOffset`: IMAGE frames moved by `offset` (whole frames, positive = later) and
    AUDIO moved by `audio_ms` (ms at `fps`, rounded to whole samples, positive = later) -> IMAGE and AUDIO
    with the same frame and sample counts as they came. InvalidInputError for a move of all frames or
    malformed AUDIO."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorFrameOffset",
            display_name="H3Director Frame Offset",
            category="H3 Director/frames",
            description="Moves the picture against the sound, or the sound against the picture. `offset`: the "
                        "picture moves by this many frames (positive = later: the first frame repeats, the last "
                        "frames go; negative: the first frames go, the last frame repeats); the audio is untouched. "
                        "`audio_ms`: the sound moves by this many ms, rounded to whole samples (positive = later: "
                        "silence at the start, the end cut; negative: the start cut, silence at the end); the "
                        "frames are untouched. Frame and sample counts are unchanged. To remove a measured offset "
                        "X ms (audio late, AV Sync Measure): audio_ms = -X, or offset = round(X * fps / 1000).",
            inputs=[
                io.Image.Input("images"),
                io.Int.Input("offset", default=0, min=-4096, max=4096,
                             tooltip="picture shift in frames (positive = later); the audio is not moved"),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=0.001),
                io.Audio.Input("audio", optional=True),
                io.Float.Input("audio_ms", default=0.0, min=-60000.0, max=60000.0, step=0.1, optional=True,
                               tooltip="sound shift in ms (positive = later); the frames are not moved"),
            ],
            outputs=[io.Image.Output(display_name="images"), io.Audio.Output(display_name="audio")],
        )

    @classmethod
    def execute(cls, images, offset, fps, audio=None, audio_ms=0.0) -> io.NodeOutput:
        if not fps > 0:
            raise InvalidInputError(f"fps must be > 0, got {fps}")
        if isinstance(images, torch.Tensor) and images.ndim == 4 and abs(int(offset)) >= images.shape[0]:
            raise InvalidInputError(f"offset {offset} frames is beyond the clip's {images.shape[0]} frames")
        shifted = shift_frames(images, offset)
        if audio is None:
            if audio_ms:
                raise InvalidInputError(f"audio_ms is {audio_ms} but no audio is connected")
            return io.NodeOutput(shifted, None)
        waveform, sample_rate = audio_input(audio)
        samples = audio_samples_for_ms(audio_ms, sample_rate)
        length = waveform.shape[-1]
        if abs(samples) >= length:
            raise InvalidInputError(f"audio_ms {audio_ms} is {abs(samples)} samples, beyond the sound's {length}")
        return io.NodeOutput(shifted, {**audio, "waveform": shift_audio(waveform, samples)})


__all__ = ["FrameOffset"]
