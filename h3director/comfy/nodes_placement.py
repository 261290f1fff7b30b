"""H3Director Device Placement: put MODEL, CLIP and VAEs on the devices `h3director plan --devices` chose.

The placement string is the plan's ("text_encoder=cuda:1,dit=cuda:0,video_vae=cuda:1,audio_vae=cuda:1"; the
aliases model, clip and vae work too). The objects come out as clones whose load devices are set
(`h3director.integrations.comfy_placement`); the inputs are left as they are. Place it right after the
loaders, before anything uses the models.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.integrations.comfy_placement import place_objects


class DevicePlacement(io.ComfyNode):
    """Node `H3DirectorDevicePlacement`: a `placement` string from `h3director plan --devices`
    ("dit=cuda:0,text_encoder=cuda:1,...") + MODEL, CLIP, VAE, audio VAE (each optional) -> clones of them
    with their load devices set (None for an unconnected input) and a `report` (STRING). A device this
    machine lacks, or a malformed string, raises InvalidInputError naming the devices it has."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorDevicePlacement",
            display_name="H3Director Device Placement",
            category="H3 Director/memory",
            description="Places the DiT (MODEL), the text encoder (CLIP) and the video and audio VAEs on the devices "
                        "of a placement string from `h3director plan --devices` (e.g. dit=cuda:0,text_encoder="
                        "cuda:1,video_vae=cuda:1,audio_vae=cuda:1). A device this machine does not have is an "
                        "error naming the ones it has. Outputs are clones; unconnected inputs give None.",
            inputs=[
                io.String.Input("placement", default="", multiline=False),
                io.Model.Input("model", optional=True),
                io.Clip.Input("clip", optional=True),
                io.Vae.Input("vae", optional=True),
                io.Vae.Input("audio_vae", optional=True),
            ],
            outputs=[io.Model.Output(display_name="model"), io.Clip.Output(display_name="clip"),
                     io.Vae.Output(display_name="vae"), io.Vae.Output(display_name="audio_vae"),
                     io.String.Output(display_name="report")],
        )

    @classmethod
    def execute(cls, placement, model=None, clip=None, vae=None, audio_vae=None) -> io.NodeOutput:
        placed = place_objects(placement, model=model, clip=clip, vae=vae, audio_vae=audio_vae)
        return io.NodeOutput(placed.model, placed.clip, placed.vae, placed.audio_vae, placed.report)


__all__ = ["DevicePlacement"]
