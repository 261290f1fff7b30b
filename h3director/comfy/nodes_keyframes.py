"""H3Director Keyframe Select and Keyframe Merge: detail only the keyframes, carry the detail to every frame.

Select picks keyframes (`h3director.video.keyframes`) and outputs them as a small IMAGE batch plus
their indices as JSON text (``"[0, 5, 10]"``, a STRING that any string node can show or edit). Any
detailer runs on that batch; Merge takes the original frames, the detailed batch (same order) and the
indices, and builds the full clip by `h3director.video.detail_carry` straight into one preallocated
IMAGE (the only whole-clip float32 tensor it makes).
"""

from __future__ import annotations

import torch
from comfy_api.latest import io

from h3director.video import keyframes
from h3director.video.detail_carry import merge_into, output_shape


class KeyframeSelect(io.ComfyNode):
    """Node `H3DirectorKeyframeSelect`: IMAGE frames + `mode` (every_n, scene, every_n+scene, motion) with
    `n` (frames), `threshold` (scene score, 0..1) and `min_spacing` (frames) -> `keyframes` (IMAGE batch),
    `indices` (STRING, a JSON list of frame indices) and `count` (INT). First and last frame are always in;
    bad parameters (n longer than the clip, threshold outside (0, 1)) raise InvalidInputError."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorKeyframeSelect",
            display_name="H3Director Keyframe Select",
            category="H3 Director/frames",
            description="Picks keyframes for keyframe-only detailing; the first and last frame are always in. "
                        "every_n: every n-th frame (a clip shorter than n is refused). scene: both sides of each "
                        "cut, where the scene score (ffmpeg's select=gt(scene,T) score: min of the mean luma change and "
                        "its change from the previous pair, on ffmpeg's scale, in [0, 1]) exceeds threshold. every_n+scene: both. motion: peaks of the "
                        "mean optical-flow magnitude, at least min_spacing frames apart. Outputs the keyframes as "
                        "a batch and their indices (JSON list text) for H3Director Keyframe Merge.",
            inputs=[
                io.Image.Input("images"),
                io.Combo.Input("mode", options=list(keyframes.MODES), default="every_n"),
                io.Int.Input("n", default=5, min=1, max=4096, tooltip="every_n, every_n+scene: keyframe spacing in frames"),
                io.Float.Input("threshold", default=0.4, min=0.01, max=0.99, step=0.01,
                               tooltip="scene, every_n+scene: a frame whose scene score is above this starts a new scene"),
                io.Int.Input("min_spacing", default=5, min=1, max=4096,
                             tooltip="motion: fewest frames between two motion peaks"),
            ],
            outputs=[io.Image.Output(display_name="keyframes"), io.String.Output(display_name="indices"),
                     io.Int.Output(display_name="count")],
        )

    @classmethod
    def execute(cls, images, mode, n, threshold, min_spacing) -> io.NodeOutput:
        selection = keyframes.select_keyframes(images, mode, n=int(n), threshold=float(threshold),
                                               min_spacing=int(min_spacing))
        batch = keyframes.gather_keyframes(images, selection.indices)
        return io.NodeOutput(batch, keyframes.format_indices(selection.indices), len(selection.indices))


class KeyframeMerge(io.ComfyNode):
    """Node `H3DirectorKeyframeMerge`: the original IMAGE frames, the detailed keyframes (same order as
    `indices`, the JSON list text Keyframe Select wrote) and `flow_warp` -> IMAGE with every frame, detail
    carried from the keyframes (`video.detail_carry`). Mismatched counts, indices or aspect raise
    InvalidInputError."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorKeyframeMerge",
            display_name="H3Director Keyframe Merge",
            category="H3 Director/frames",
            description="Rebuilds every frame from the originals and the detailed keyframes: at a keyframe the "
                        "detailed frame itself; between two keyframes the original plus both keyframes' detail "
                        "(detailed - original), weighted linearly in time and, with flow_warp, moved along the "
                        "motion (Farneback optical flow); clipped to [0, 1]. Detailed keyframes may be larger "
                        "(an upscaler) if all share one size of the frames' aspect ratio: the originals are resized to it.",
            inputs=[
                io.Image.Input("images", tooltip="the original frames"),
                io.Image.Input("detailed_keyframes", tooltip="the detailer's output for Keyframe Select's batch"),
                io.String.Input("indices", default="", tooltip="Keyframe Select's indices (JSON list)"),
                io.Boolean.Input("flow_warp", default=True,
                                 tooltip="move the detail along the optical flow (needs OpenCV)"),
            ],
            outputs=[io.Image.Output(display_name="images")],
        )

    @classmethod
    def execute(cls, images, detailed_keyframes, indices, flow_warp) -> io.NodeOutput:
        index = keyframes.parse_indices(indices)
        shape = output_shape(images, detailed_keyframes, index)
        out = torch.empty(shape, dtype=torch.float32)
        merge_into(out, images, detailed_keyframes, index, flow_warp=bool(flow_warp))
        return io.NodeOutput(out)


__all__ = ["KeyframeMerge", "KeyframeSelect"]
