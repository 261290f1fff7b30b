"""H3Director Upscale (Streaming): ComfyUI's UPSCALE_MODEL over a video frame by frame, tile by tile, straight to a
file in the output folder (`h3director.video.upscale`), so the upscaled video is never whole in RAM; optionally
resized before the model and after it (restore a 4K video at 1080p, Lanczos back), in fp16/bf16, several tiles per
call."""

from __future__ import annotations

from comfy_api.latest import io

from h3director.errors import InvalidInputError
from h3director.video.resize import FILTERS
from h3director.video.upscale_stages import DTYPES

FORMATS = ("mp4", "npy")


def _overlap(text: str) -> int | str:
    value = str(text).strip().lower()
    if value == "auto":
        return "auto"
    try:
        number = int(value)
    except ValueError:
        raise InvalidInputError(f"overlap must be 'auto' or a number of input pixels, got {text!r}") from None
    if number < 0:
        raise InvalidInputError(f"overlap must be 'auto' or >= 0 input pixels, got {number}")
    return number


def _source(images, source_path: str, fps: float):
    """The frames to upscale: the IMAGE batch, or a video / .npy file (absolute, or inside ComfyUI's input folder)."""
    from pathlib import Path

    from h3director.video.upscale_sources import ArraySource, open_source

    path_text = str(source_path or "").strip()
    if images is not None and path_text:
        raise InvalidInputError("connect images or give source_path, not both")
    if images is not None:
        return ArraySource(images, fps=fps, identity="comfy-image", what="images")
    if not path_text:
        raise InvalidInputError("nothing to upscale: connect images or give source_path (a video or .npy file)")
    path = Path(path_text)
    if not path.is_absolute():
        import folder_paths

        path = Path(folder_paths.get_input_directory()) / path
    return open_source(path, fps=None if path.suffix.lower() != ".npy" else fps)


def _sink(target, fmt: str, source, audio, crf: int):
    from h3director.comfy.audio_input import audio_input
    from h3director.video.sinks import MemmapSink, VideoFileSink
    from h3director.video.upscale_audio import AudioCopyVideoSink

    if fmt == "npy":
        if audio is not None:
            raise InvalidInputError("a .npy output holds frames only: use format mp4 to keep the audio")
        return MemmapSink(target.path), None
    if audio is not None:
        waveform, rate = audio_input(audio)
        if waveform.dim() != 3 or waveform.shape[1] not in (1, 2):
            raise InvalidInputError(f"audio must be [batch, 1 or 2 channels, samples], got {list(waveform.shape)}")
        return VideoFileSink(target.path, fps=source.fps, crf=crf, audio_sample_rate=rate,
                             audio_channels=int(waveform.shape[1])), (waveform[:1].float(), rate)
    if source.audio_path is not None:
        return AudioCopyVideoSink(target.path, source.audio_path, fps=source.fps, crf=crf), None
    return VideoFileSink(target.path, fps=source.fps, crf=crf), None


class UpscaleStreaming(io.ComfyNode):
    """Node `H3DirectorUpscaleStreaming`: an UPSCALE_MODEL + IMAGE frames or a `source_path` (video or
    .npy), `tile` (largest tile side, input px), `overlap` ("auto" or input px), `format`, `fps`, `crf`,
    optional AUDIO and resize, dtype and batching options -> `path` (STRING, the file written in the output
    folder), `preview` (IMAGE, the first upscaled frame) and `report` (STRING). One frame at a time, with
    exact tile seams for convolutional models; bad options or a model that cannot run in `dtype` raise
    InvalidInputError before anything is written."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorUpscaleStreaming",
            display_name="H3Director Upscale (Streaming)",
            category="H3 Director/frames",
            description=(
                "Upscales frames one at a time, tile by tile, with an upscale model (Load Upscale Model), writing "
                "each finished frame into an MP4 or .npy in the output folder: the upscaled video is never whole in "
                "memory. overlap 'auto' covers the model's receptive field and keeps only each tile's centre, so for "
                "convolutional models (ESRGAN/RRDB, RealESRGAN Compact, PLKSR) the result equals the untiled upscale up to "
                "float rounding; other models get a feathered blend (the report says 'not exact'). A tile that runs "
                "out of memory is halved and retried. Audio (the AUDIO input, or a source video's own) goes into "
                "the MP4."),
            inputs=[
                io.UpscaleModel.Input("upscale_model"),
                io.Image.Input("images", optional=True, tooltip="Frames to upscale (or use source_path)."),
                io.String.Input("source_path", default="", optional=True,
                                tooltip="A video file or .npy of uint8 frames [F, H, W, 3] instead of images; "
                                        "relative paths are inside ComfyUI's input folder."),
                io.Int.Input("tile", default=512, min=16, max=8192, step=8,
                             tooltip="Largest tile side in input pixels."),
                io.String.Input("overlap", default="auto",
                                tooltip="'auto' (the receptive field: exact seams for convolutional models) or "
                                        "input pixels of context per side."),
                io.Combo.Input("format", options=list(FORMATS), default="mp4"),
                io.String.Input("filename_prefix", default="video/H3Director_upscaled",
                                tooltip="Relative to ComfyUI's output folder."),
                io.Float.Input("fps", default=24.0, min=1.0, max=240.0, step=1.0,
                               tooltip="Frame rate of images / .npy input (a video keeps its own)."),
                io.Int.Input("crf", default=18, min=0, max=51, tooltip="H.264 quality: 0 lossless, 18 visually lossless."),
                io.Audio.Input("audio", optional=True, tooltip="Soundtrack muxed into the MP4."),
                io.String.Input("pre_resize", default="", optional=True,
                                tooltip="WxH (even): resize each frame before the model, e.g. a 4K video to "
                                        "1920x1080; empty: off."),
                io.Combo.Input("pre_resample", options=list(FILTERS), default="area", optional=True,
                               tooltip="Filter of pre_resize (Pillow, deterministic)."),
                io.String.Input("post_resize", default="", optional=True,
                                tooltip="WxH (even): resize each model output to the target size; empty: off."),
                io.Combo.Input("resample", options=list(FILTERS), default="lanczos", optional=True,
                               tooltip="Filter of post_resize (Pillow, deterministic)."),
                io.Combo.Input("dtype", options=list(DTYPES), default="fp32", optional=True,
                               tooltip="Model dtype: fp16/bf16 are approximate (the report gives the measured "
                                       "difference from fp32); the loaded model is not changed (a copy runs)."),
                io.Int.Input("tile_batch", default=1, min=1, max=64, optional=True,
                             tooltip="Tiles of equal size per model call; halved when a batch runs out of memory."),
            ],
            outputs=[
                io.String.Output(display_name="path"),
                io.Image.Output(display_name="preview", tooltip="The first upscaled frame."),
                io.String.Output(display_name="report"),
            ],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, upscale_model, tile, overlap, format, filename_prefix, fps, crf, images=None,
                source_path="", audio=None, pre_resize="", pre_resample="area", post_resize="",
                resample="lanczos", dtype="fp32", tile_batch=1) -> io.NodeOutput:
        import comfy.model_management

        from h3director.comfy import runtime
        from h3director.comfy.nodes_decode import _progress_callback
        from h3director.integrations.spandrel_models import from_descriptor
        from h3director.video.upscale import Recipe, prepare, stream_upscale
        from h3director.video.upscale_stages import parse_dtype

        if format not in FORMATS:
            raise InvalidInputError(f"format must be one of {FORMATS}, got {format!r}")
        pre, post = str(pre_resize or "").strip(), str(post_resize or "").strip()
        recipe = Recipe.build(pre_resize=pre or None, pre_resample=pre_resample if pre else None,
                              post_resize=post or None, resample=resample if post else None, tile_batch=tile_batch)
        run_dtype = parse_dtype(dtype)
        source = _source(images, source_path, float(fps))
        # the model's weights on ComfyUI's device, as Upscale Image (using Model) loads them
        patcher = getattr(upscale_model, "patcher", None)
        if patcher is not None:
            comfy.model_management.load_models_gpu([patcher], force_full_load=True)
        model = from_descriptor(upscale_model, dtype=run_dtype)
        prepare(model, source, int(tile), _overlap(overlap), recipe)        # refusals before any file exists
        height, width = recipe.pre_resize or (source.height, source.width)
        height, width = recipe.post_resize or (height * model.scale, width * model.scale)
        target = runtime.save_target(filename_prefix, width, height, format)
        sink, waveform = _sink(target, format, source, audio, int(crf))
        report = stream_upscale(model, source, sink, tile=int(tile), overlap=_overlap(overlap), audio=waveform,
                                on_frame=_progress_callback(), keep_first=True, recipe=recipe)
        preview = report.first_frame[None].clamp(0, 1) if report.first_frame is not None else None
        return io.NodeOutput(str(report.result), preview, "\n".join(report.lines()))


__all__ = ["UpscaleStreaming"]
