"""H3Director Stitch: join two chained segments (IMAGE + AUDIO each) that share `overlap` frames.

Chain k segments with k-1 nodes (the running result as segment A). Frame counts, the audio join instant
and the cross-fades follow `h3director.av.stitch_arrays` (the same rules as `h3director stitch` on files).
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.av.stitch_arrays import join_audio, join_frames
from h3director.comfy.audio_input import audio_input
from h3director.errors import InvalidInputError


class Stitch(io.ComfyNode):
    """Node `H3DirectorStitch`: segments A and B (IMAGE + AUDIO each) sharing `overlap` frames at `fps` ->
    IMAGE of A + B - overlap frames and AUDIO as long as that picture, joined by `blend` (cut or
    crossfade). InvalidInputError for differing frame sizes, channels or sample rates, or a sound too short
    for the join."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorStitch",
            display_name="H3Director Stitch",
            category="H3 Director/frames",
            description="Joins segment B after segment A where they share `overlap` frames: A + B - overlap frames. "
                        "Video: cut (A is kept through the overlap) or a linear cross-fade inside the overlap. "
                        "Audio: B's sound starts at the overlap's first frame (nearest sample) and is cross-faded "
                        "with equal power over the overlap; the result's sound is as long as its picture.",
            inputs=[
                io.Image.Input("images_a"),
                io.Audio.Input("audio_a"),
                io.Image.Input("images_b"),
                io.Audio.Input("audio_b"),
                io.Int.Input("overlap", default=22, min=0, max=4096),
                io.Combo.Input("blend", options=["crossfade", "cut"], default="crossfade"),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=1.0),
            ],
            outputs=[io.Image.Output(display_name="images"), io.Audio.Output(display_name="audio")],
        )

    @classmethod
    def execute(cls, images_a, audio_a, images_b, audio_b, overlap, blend, fps) -> io.NodeOutput:
        wave_a, rate_a = audio_input(audio_a, "audio_a")
        wave_b, rate_b = audio_input(audio_b, "audio_b")
        if rate_a != rate_b:
            raise InvalidInputError(f"sample rates differ: {rate_a} Hz then {rate_b} Hz; both must match")
        images = join_frames(images_a, images_b, int(overlap), blend)
        wave = join_audio(wave_a, wave_b, rate_a, float(fps), images_a.shape[0], images_b.shape[0], int(overlap))
        return io.NodeOutput(images, {"waveform": wave, "sample_rate": rate_a})


__all__ = ["Stitch"]
