"""H3Director Decode AV (Streaming): ComfyUI's VAE, clip by clip, straight into an MP4 or IMAGE frames."""

from __future__ import annotations

from comfy_api.latest import io, ui

from h3director.comfy.latents import save_latent_before_decode, split_av_latent
from h3director.errors import InvalidInputError
from h3director.units import GiB, format_size

OUTPUT_VIDEO = "video_file"
OUTPUT_IMAGES = "images"
#: The report line of a video-only decode of an AV latent (audio_vae left unconnected).
AUDIO_SKIPPED_NOTE = "audio not decoded: no audio VAE connected (video only; no audio stream, audio output None)"


def _report_text(report, target: str | None) -> str:
    lines = [f"frames: {report.frames} in {report.clips} clips, {report.seconds:.1f} s"]
    lines.extend(report.notes)
    if report.audio_samples:
        lines.append(f"audio: {report.audio_samples} samples per channel")
    if report.preflight is not None:
        lines.append(f"one clip: {format_size(report.preflight.clip_bytes)} on the VAE device, "
                     f"sink: {format_size(report.preflight.sink_bytes)} of host memory")
    if report.peak_bytes is not None:
        lines.append(f"peak allocated on the device: {format_size(report.peak_bytes)}")
    lines.extend(f"out-of-memory retry on clip {r.clip}: {r.retried_with.describe()} ({r.error})"
                 for r in report.retries)
    if target:
        lines.append(f"saved: {target}")
    return "\n".join(lines)


def make_room_for_decode(vae, adapter, clip_bytes: int) -> int:
    """Unload other models when one clip plus the VAE weights will not fit the VAE device; return the need.

    The need is `clip_bytes` (ComfyUI's own per-clip estimate, `adapter.clip_working_set_bytes`)
    plus the VAE's weights; on the CPU nothing is unloaded (models there are host memory anyway).
    """
    from h3director.comfy import runtime

    need = clip_bytes + int(vae.model_size() if hasattr(vae, "model_size") else 0)
    if adapter.device.type != "cpu" and runtime.free_bytes(adapter.device) < need:
        runtime.free_device_memory(need, adapter.device)
    runtime.load_vae(vae, clip_bytes)
    return need


class DecodeAVStreaming(io.ComfyNode):
    """Node `H3DirectorDecodeAVStreaming`: an H3 AV (or video) LATENT + ComfyUI's video VAE (and optionally
    the audio VAE) -> `images` (IMAGE: every frame in 'images' mode, the last frame in 'video_file' mode),
    `audio` (AUDIO, None without an audio VAE) and a `report` (STRING). Decodes clip by clip, bit-identical
    to VAE Decode, without the whole video in float32; 'video_file' writes an MP4 at `fps` (frames per
    second) and `crf` under `filename_prefix` in the output folder; `budget_gb` is one clip's budget on the
    VAE device in GiB (0: h3_config.yaml). Bad latents raise InvalidInputError before decoding; a clip that
    cannot fit any execution raises `DecodeOutOfMemory`, keeping what was written."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorDecodeAVStreaming",
            display_name="H3Director Decode AV (Streaming)",
            category="H3 Director/decode",
            description=(
                "Decodes a MiniMax H3 AV latent (or a plain H3 video latent) clip by clip through ComfyUI's "
                "VAE, bit-identical to VAE Decode. 'video_file' encodes each finished clip straight into an "
                "MP4 (audio muxed) in the output folder, so memory stays flat in video length; 'images' "
                "returns IMAGE frames (one float32 buffer, half of VAE Decode's peak). Leave audio_vae "
                "unconnected for a video-only result: the audio latent is not decoded, the MP4 has no audio "
                "stream and the audio output is None, and no audio VAE needs to be loaded anywhere."),
            inputs=[
                io.Latent.Input("samples", tooltip="H3 AV latent (video + audio) or plain H3 video latent."),
                io.Vae.Input("vae", tooltip="MiniMax H3 video VAE (VAELoader)."),
                io.Vae.Input("audio_vae", optional=True,
                             tooltip="MiniMax H3 audio VAE. Unconnected: video only (an AV latent's audio "
                                     "is not decoded; no audio stream, audio output None)."),
                io.Combo.Input("output", options=[OUTPUT_VIDEO, OUTPUT_IMAGES], default=OUTPUT_VIDEO),
                io.String.Input("filename_prefix", default="video/H3Director",
                                tooltip="Relative to ComfyUI's output folder (video_file mode)."),
                io.Float.Input("fps", default=24.0, min=1.0, max=120.0, step=1.0),
                io.Int.Input("crf", default=18, min=0, max=51, tooltip="H.264 quality: 0 lossless, 18 visually lossless."),
                io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5, optional=True,
                               tooltip="Memory budget for one clip on the VAE device in GiB; 0 = h3_config.yaml."),
                io.Boolean.Input("save_latent", default=True, optional=True,
                                 tooltip="Write the latent to output/latents/ before decoding, so a decode that "
                                         "dies is rerun from the file (h3director decode FILE)."),
            ],
            outputs=[
                io.Image.Output(display_name="images",
                                tooltip="All frames in 'images' mode; the last frame in 'video_file' mode."),
                io.Audio.Output(display_name="audio", tooltip="Decoded soundtrack (None without audio)."),
                io.String.Output(display_name="report"),
            ],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, output, filename_prefix, **kwargs) -> bool | str:
        if output == OUTPUT_VIDEO and not str(filename_prefix).strip():
            return "filename_prefix must not be empty in video_file mode"
        return True

    @classmethod
    def execute(cls, samples, vae, output, filename_prefix, fps, crf, audio_vae=None,
                budget_gb=0.0, save_latent=True) -> io.NodeOutput:
        from h3director.comfy import runtime
        from h3director.comfy.image_sink import ComfyImageSink, LastFrameTap
        from h3director.integrations.comfy_vae import ComfyH3AudioAdapter, ComfyH3VideoAdapter
        from h3director.video.levels import describe_buffers
        from h3director.video.scheduler import AudioJob, stream_decode

        av_latent = split_av_latent(samples)
        video = av_latent.video
        if output not in (OUTPUT_VIDEO, OUTPUT_IMAGES):
            raise InvalidInputError(f"output must be {OUTPUT_VIDEO!r} or {OUTPUT_IMAGES!r}, got {output!r}")
        if output == OUTPUT_VIDEO and video.shape[0] != 1:
            raise InvalidInputError(f"video_file mode writes one video; the latent has batch {video.shape[0]} "
                                    f"(use output 'images', or split the batch)")
        skipped_audio = av_latent.audio is not None and audio_vae is None
        adapter = ComfyH3VideoAdapter(vae)
        audio_adapter = ComfyH3AudioAdapter(audio_vae) if av_latent.audio is not None and not skipped_audio else None
        if audio_adapter is not None:
            audio_adapter.validate(av_latent.audio)
        adapter.validate(video)
        clip_bytes = adapter.clip_working_set_bytes(video.shape[0], video.shape[3], video.shape[4],
                                                    adapter.default_execution())
        adapter.on_out_of_memory = lambda: runtime.free_device_memory(2 * clip_bytes, adapter.device)
        # The video file muxes the soundtrack as it is written; IMAGE mode returns it beside the frames.
        audio_job = AudioJob(adapter=audio_adapter, latents=av_latent.audio) \
            if audio_adapter is not None and output == OUTPUT_VIDEO else None

        target = None
        if output == OUTPUT_VIDEO:
            from h3director.video.sinks import VideoFileSink

            height, width = adapter.output_size(video.shape[3], video.shape[4])
            target = runtime.save_target(filename_prefix, width, height, "mp4")
            inner = VideoFileSink(target.path, fps=fps, crf=crf,
                                  audio_sample_rate=audio_adapter.sample_rate if audio_adapter else None)
            sink = LastFrameTap(inner)
        else:
            sink = ComfyImageSink()

        from h3director.comfy.live import phase
        from h3director.comfy.settings import pack_config

        config = pack_config()
        # after every check (the video path too), before the first decoder call
        latent_note = save_latent_before_decode(filename_prefix, av_latent) if save_latent else None
        if not config.features().streaming_decode:
            return _reference_decode(vae, video, av_latent.audio, audio_adapter, output, target, fps, crf,
                                     skipped_audio, latent_note)
        budget = int(budget_gb * GiB) if budget_gb else None
        with phase("H3 streaming decode"):
            # audio first: loading the audio VAE may move the video VAE off the device
            waveform = audio_adapter.decode(av_latent.audio) if audio_adapter is not None else None
            make_room_for_decode(vae, adapter, clip_bytes)
            report = stream_decode(adapter, video, sink, budget_bytes=budget, audio=audio_job,
                                   on_progress=_progress_callback(), config=config)
            report.notes.append(describe_buffers(report))
            if output == OUTPUT_VIDEO:   # frames reach the MP4 through h3director.native.pack_frames
                from h3director.core.environment import native_core_line

                report.notes.append(f"native core: {native_core_line()}")
            if skipped_audio:
                report.notes.append(AUDIO_SKIPPED_NOTE)
        audio_out = None if waveform is None else {"waveform": waveform, "sample_rate": audio_adapter.sample_rate}
        text = _report_text(report, str(target.path) if target else None)
        if latent_note:
            text += "\n" + latent_note
        if output == OUTPUT_VIDEO:
            preview = ui.PreviewVideo([ui.SavedResult(target.filename, target.subfolder, io.FolderType.output)])
            return io.NodeOutput(sink.last_frame, audio_out, text, ui=preview)
        return io.NodeOutput(report.result, audio_out, text)


def _reference_decode(vae, video, audio_latent, audio_adapter, output, target, fps, crf,
                      skipped_audio: bool = False, latent_note: str | None = None) -> io.NodeOutput:
    """Memory level 0: ComfyUI's own `vae.decode` of the whole video (what VAE Decode runs), no streaming.

    'images' returns its IMAGE as it is; 'video_file' encodes those frames (already display pixels in
    [0, 1]) into the MP4 with the soundtrack."""
    import time

    import torch

    from h3director.video.levels import REFERENCE_NOTE
    from h3director.video.sinks.contract import StreamSpec

    started = time.perf_counter()
    waveform = audio_adapter.decode(audio_latent) if audio_adapter is not None else None
    images = vae.decode(video)
    if images.ndim == 5:   # [B, F, H, W, C] -> ComfyUI's IMAGE [B * F, H, W, C], as VAE Decode does
        images = images.reshape(-1, *images.shape[-3:])
    audio_out = None if waveform is None else {"waveform": waveform, "sample_rate": audio_adapter.sample_rate}
    lines = [f"frames: {images.shape[0]} in one call, {time.perf_counter() - started:.1f} s", REFERENCE_NOTE]
    if skipped_audio:
        lines.append(AUDIO_SKIPPED_NOTE)
    if latent_note:
        lines.append(latent_note)
    if output != OUTPUT_VIDEO:
        return io.NodeOutput(images, audio_out, "\n".join(lines))
    from h3director.video.sinks import VideoFileSink

    frames = images.movedim(-1, 0).unsqueeze(0)      # [1, C, F, H, W], display pixels
    channels = frames.shape[1]
    spec = StreamSpec(batch=1, channels=channels, frames=frames.shape[2], height=frames.shape[3],
                      width=frames.shape[4], fps=fps, pixel_mean=(0.0,) * channels, pixel_std=(1.0,) * channels)
    sink = VideoFileSink(target.path, fps=fps, crf=crf,
                         audio_sample_rate=audio_adapter.sample_rate if waveform is not None else None)
    sink.begin(spec)
    try:
        if waveform is not None:
            sink.write_audio(waveform, audio_adapter.sample_rate)
        sink.write(0, frames.to(torch.float32))
        sink.finish()
    except BaseException:
        sink.abort()
        raise
    lines.append(f"saved: {target.path}")
    preview = ui.PreviewVideo([ui.SavedResult(target.filename, target.subfolder, io.FolderType.output)])
    return io.NodeOutput(images[-1:], audio_out, "\n".join(lines), ui=preview)


def _progress_callback():
    """A `(done, total)` callback driving ComfyUI's progress bar (no-op outside ComfyUI)."""
    try:
        import comfy.utils
    except ImportError:
        return None
    bar = {"pbar": None}

    def update(done: int, total: int) -> None:
        if bar["pbar"] is None:
            bar["pbar"] = comfy.utils.ProgressBar(total)
        bar["pbar"].update_absolute(done, total)

    return update


__all__ = ["AUDIO_SKIPPED_NOTE", "DecodeAVStreaming"]
