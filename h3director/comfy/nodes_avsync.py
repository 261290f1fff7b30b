"""H3Director AV Sync Measure: the A/V offset of IMAGE frames and AUDIO, with a plot of both envelopes."""

from __future__ import annotations

import numpy as np
import torch
from comfy_api.latest import io

from h3director.av.measure import DEFAULT_MAX_OFFSET_MS, DEFAULT_WINDOW_S, AVSyncResult, measure_arrays
from h3director.comfy.audio_input import audio_input
from h3director.errors import InvalidInputError

MOTION_WIDTH = 160  # frames are subsampled to about this many pixels across before differencing


def measure_images(images: torch.Tensor, audio: dict, fps: float,
                   max_offset_ms: float = DEFAULT_MAX_OFFSET_MS) -> AVSyncResult:
    """Measure IMAGE ``[F, H, W, C]`` (frame k at k / fps) against AUDIO ``{"waveform": [B, C, L],
    "sample_rate"}`` (batch item 0, channels mixed, sample 0 at time 0). Positive offset: audio late."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise InvalidInputError(f"IMAGE must be [frames, H, W, C], got {getattr(images, 'shape', type(images))}")
    waveform, sample_rate = audio_input(audio)
    if not isinstance(waveform, torch.Tensor) or waveform.ndim != 3 or waveform.shape[0] < 1:
        raise InvalidInputError(f"AUDIO waveform must be [B, channels, samples], got {getattr(waveform, 'shape', None)}")
    stride = max(1, images.shape[2] // MOTION_WIDTH)
    frames = (images[k, ::stride, ::stride].to(torch.float32).cpu().numpy() for k in range(images.shape[0]))
    samples = waveform[0].to(torch.float32).cpu().numpy()
    return measure_arrays(frames, float(fps), samples, sample_rate, max_offset_ms=max_offset_ms,
                          window_s=DEFAULT_WINDOW_S)


def result_image(result: AVSyncResult) -> torch.Tensor:
    """The result's envelope plot as a ComfyUI IMAGE ``[1, H, W, 3]`` float32 in [0, 1]."""
    from h3director.av.plot import envelope_rgb

    return torch.from_numpy(np.asarray(envelope_rgb(result), np.float32) / 255.0).unsqueeze(0)


def result_text(result: AVSyncResult) -> str:
    if result.offset_ms is None:
        return result.reason
    text = (f"offset {result.offset_ms:+.1f} ms ({'audio late' if result.offset_ms >= 0 else 'audio early'}), "
            f"confidence {result.confidence:.2f}")
    return text if result.reason == "ok" else f"{text}; {result.reason}"


class AVSyncMeasure(io.ComfyNode):
    """Node `H3DirectorAVSyncMeasure`: IMAGE frames + AUDIO at `fps` (frames per second), searched up to
    `max_offset_ms` (ms) -> `offset_ms` (FLOAT, ms, positive = audio late), `confidence` (FLOAT, 0..1),
    `plot` (IMAGE of both envelopes) and `report` (STRING). No distinct events: offset 0 and confidence 0,
    not an error."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorAVSyncMeasure",
            display_name="H3Director AV Sync Measure",
            category="H3 Director/frames",
            description="Measures how late the sound is against the picture (positive offset_ms = audio late): "
                        "sound onsets (the 20 % point of each rise) paired with picture onsets, a frame standing at its "
                        "timestamp. "
                        "Without distinct events it says 'no usable events' (offset 0, confidence 0). To correct: "
                        "Frame Offset with audio_ms = -offset_ms, or offset = round(offset_ms * fps / 1000).",
            inputs=[
                io.Image.Input("images"),
                io.Audio.Input("audio"),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=0.001),
                io.Float.Input("max_offset_ms", default=DEFAULT_MAX_OFFSET_MS, min=10.0, max=5000.0, step=10.0, optional=True,
                               tooltip="search offsets within +- this many ms"),
            ],
            outputs=[io.Float.Output(display_name="offset_ms"), io.Float.Output(display_name="confidence"),
                     io.Image.Output(display_name="plot"), io.String.Output(display_name="report")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, images, audio, fps, max_offset_ms=DEFAULT_MAX_OFFSET_MS) -> io.NodeOutput:
        result = measure_images(images, audio, fps, max_offset_ms)
        text = result_text(result)
        offset = 0.0 if result.offset_ms is None else float(result.offset_ms)
        return io.NodeOutput(offset, float(result.confidence), result_image(result), text, ui={"text": (text,)})


__all__ = ["AVSyncMeasure"]
