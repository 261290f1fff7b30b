"""Staged generation nodes: a video-only draft (stage one) and its refinement at full size with audio (stage two).

- `H3DirectorVideoOnlyLatent`: an H3 AV latent without its audio rows (0 audio latent frames). H3's DiT packs
  ``[text | cond | audio | video]``; with no audio rows the video rows keep their positions (audio and video
  share the timeline origin, ComfyUI `PackedLayout`) and attend only to text, conditioning and each other.
- `H3DirectorVideoStream`: the video stream of an AV latent as a plain video LATENT, which stock ``SaveLatent``
  can write (it cannot write a NestedTensor) and `H3DirectorDecodeAVStreaming` decodes without an audio VAE.
- `H3DirectorDraftToAV`: a draft video latent resized (approximate: `video.latent_resize`) to the video of a
  full-size AV latent, with that latent's audio stream: the start of a re-noise-and-refine pass (KSampler with
  denoise below 1), like a hires fix.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.comfy.latents import split_av_latent
from h3director.errors import InvalidInputError


def _av_latent(video, audio) -> dict:
    """A LATENT holding the AV pair (video, audio) and nothing else (a noise mask of the input's shape would
    no longer apply)."""
    import comfy.nested_tensor

    return {"samples": comfy.nested_tensor.NestedTensor((video, audio))}


class VideoOnlyLatent(io.ComfyNode):
    """Node `H3DirectorVideoOnlyLatent`: an H3 AV LATENT -> the same latent with 0 audio latent frames (a
    video-only draft). InvalidInputError for a LATENT that is not an H3 AV latent."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorVideoOnlyLatent",
            display_name="H3Director Video-only Latent",
            category="H3 Director/staged",
            description="Drops the audio rows of an H3 AV latent (0 audio latent frames), so the sampler draws a "
                        "video-only draft: a shorter packed sequence. Video rows keep their positions; the DiT "
                        "was trained with audio rows, so the draft is a preview, not the final video.",
            inputs=[io.Latent.Input("samples", tooltip="H3 AV latent, e.g. from MiniMaxH3ImageToVideo")],
            outputs=[io.Latent.Output(display_name="samples")],
        )

    @classmethod
    def execute(cls, samples) -> io.NodeOutput:
        av = split_av_latent(samples)
        if av.audio is None:
            raise InvalidInputError("H3DirectorVideoOnlyLatent expects an H3 AV latent (video, audio); a plain "
                                    "video latent cannot be sampled by H3's DiT")
        return io.NodeOutput(_av_latent(av.video, av.audio[..., :0].contiguous()))


class VideoStream(io.ComfyNode):
    """Node `H3DirectorVideoStream`: an H3 AV LATENT (or a plain video LATENT) -> its video stream as a plain
    video LATENT, which stock SaveLatent can write. InvalidInputError for anything but an H3 LATENT."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorVideoStream",
            display_name="H3Director Video Stream",
            category="H3 Director/staged",
            description="The video stream of an H3 AV latent as a plain video LATENT: stock SaveLatent writes it "
                        "(it cannot write the AV pair) and the streaming decode reads it without an audio VAE.",
            inputs=[io.Latent.Input("samples")],
            outputs=[io.Latent.Output(display_name="video")],
        )

    @classmethod
    def execute(cls, samples) -> io.NodeOutput:
        return io.NodeOutput({"samples": split_av_latent(samples).video.contiguous()})


class DraftToAV(io.ComfyNode):
    """Node `H3DirectorDraftToAV`: a draft video LATENT + the full-size H3 AV LATENT `samples` -> the draft
    resized to `samples`' video (approximate: time linear, space bilinear) with `samples`' audio stream.
    InvalidInputError when either latent has the wrong kind or channels."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorDraftToAV",
            display_name="H3Director Draft to AV",
            category="H3 Director/staged",
            description="Stage two of staged generation: resizes a draft video latent (LoadLatent of stage one's "
                        "SaveLatent) to the video of the full-size AV latent `samples` (time linear, space "
                        "bilinear; approximate) and attaches that latent's audio stream. Sample it with "
                        "denoise below 1 to refine the draft at full size and generate the audio.",
            inputs=[io.Latent.Input("draft", tooltip="the draft: a plain H3 video latent or an AV latent"),
                    io.Latent.Input("samples", tooltip="the full-size H3 AV latent (MiniMaxH3ImageToVideo at the "
                                                       "final width, height and length)")],
            outputs=[io.Latent.Output(display_name="samples")],
        )

    @classmethod
    def execute(cls, draft, samples) -> io.NodeOutput:
        from h3director.video.latent_resize import resize_video_latent

        source = split_av_latent(draft).video
        target = split_av_latent(samples)
        if target.audio is None:
            raise InvalidInputError("H3DirectorDraftToAV: `samples` must be the full-size H3 AV latent "
                                    "(video, audio), got a plain video latent")
        if source.shape[0] != target.video.shape[0]:
            raise InvalidInputError(f"draft batch {source.shape[0]} differs from the target's "
                                    f"{target.video.shape[0]}")
        _, _, frames, height, width = target.video.shape
        if source.shape[3] > height or source.shape[4] > width or source.shape[2] > frames:
            raise InvalidInputError(
                f"the draft latent {list(source.shape[2:])} (frames, h, w) is larger than the final video's "
                f"{[frames, height, width]}: stage two refines a smaller draft")
        video = resize_video_latent(source, frames, height, width).to(target.video.dtype)
        return io.NodeOutput(_av_latent(video, target.audio))


__all__ = ["DraftToAV", "VideoOnlyLatent", "VideoStream"]
