"""`h3director stitch SEG1 SEG2 ... --overlap 22 [--blend cut|crossfade] --out OUT.mp4`.

Joins chained segments that share `--overlap` frames into one file, streaming (see `h3director.av.stitch`):
``sum(frames) - (k - 1) x overlap`` frames, audio joined at the overlap's first frame and cross-faded over the
overlap (linear where the overlapping sound is correlated, else equal power), as long as the picture to the sample
(AAC's end padding signalled: see `h3director.av.audio_end`). `--codec h264-lossless` or `ffv1` (.mkv) with `--audio-codec pcm` keep every
frame and sample outside the overlaps exactly as decoded from the inputs.
"""

from __future__ import annotations

import json

HELP = "join chained segments that share N frames into one file (streaming, exact frame count, A/V in step)"


def add_arguments(parser) -> None:
    """Add `h3director stitch`'s options to `parser` (its argparse sub-parser)."""
    from h3director.av.stitch import AUDIO_CODECS, BLENDS, VIDEO_CODECS

    parser.add_argument("segments", nargs="+", help="segment files in chain order (2 or more)")
    parser.add_argument("--overlap", type=int, default=22, help="frames each segment shares with the next (22)")
    parser.add_argument("--blend", choices=BLENDS, default=None,
                        help="video inside the overlap: cut (keep the earlier segment) or linear crossfade "
                             "(default); latent mode always cuts")
    parser.add_argument("--out", required=True, help="output file (.mp4, .mov or .mkv)")
    parser.add_argument("--codec", choices=VIDEO_CODECS, default="h264",
                        help="h264 (CRF, lossy), h264-lossless (qp 0) or ffv1 (.mkv)")
    parser.add_argument("--audio-codec", choices=AUDIO_CODECS, default=None,
                        help="aac (default with h264), pcm (default with the lossless codecs) or flac")
    parser.add_argument("--crf", type=int, default=18, help="libx264 CRF for --codec h264 (18)")
    parser.add_argument("--preset", default="medium", help="libx264 preset (medium)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    latent = parser.add_argument_group("latent mode (segments are latent files, joined then decoded once)")
    latent.add_argument("--vae", default=None, help="video VAE (folder or .safetensors): turns on latent mode")
    latent.add_argument("--audio-vae", default=None, help="audio VAE for the segments' 'audio_latents'")
    latent.add_argument("--device", default="cpu", help="decoder device (cpu, cuda, cuda:1, mps)")
    latent.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")


def _run_latents(args) -> int:
    from h3director.core.atomic_file import check_output_path
    from h3director.core.host_heap import pin_decode_threshold
    from h3director.errors import InvalidInputError
    from h3director.integrations.load_vae import audio_adapter_for, load_vae, video_adapter_for
    from h3director.video.latent_file import read_latent_file
    from h3director.video.sinks.video_file import CONTAINER_FORMATS, VideoFileSink
    from h3director.video.stitch_latents import check_latent_chain, decode_stitched

    if args.blend == "crossfade":
        raise InvalidInputError("latent mode joins by a cut in latent space; --blend crossfade does not apply")
    files = [read_latent_file(path) for path in args.segments]
    audios = [f.audio for f in files]
    if args.audio_vae and any(a is None for a in audios):
        missing = [str(f.path) for f in files if f.audio is None]
        raise InvalidInputError(f"--audio-vae given but {', '.join(missing)} hold(s) no 'audio_latents'")
    check_latent_chain([f.video for f in files], args.overlap)       # before any weights are loaded
    check_output_path(args.out, tuple(CONTAINER_FORMATS), "--out")
    pin_decode_threshold()                 # this process is the director's own (see core/host_heap.py)
    video_adapter = video_adapter_for(load_vae(args.vae, "video", args.dtype, args.device))
    audio_adapter = audio_adapter_for(load_vae(args.audio_vae, "audio", args.dtype, args.device)) \
        if args.audio_vae else None
    sink = VideoFileSink(args.out, crf=args.crf, preset=args.preset,
                         audio_sample_rate=audio_adapter.sample_rate if audio_adapter else None)
    report = decode_stitched(video_adapter, [f.video for f in files], sink,
                             audios=audios if audio_adapter else None, audio_adapter=audio_adapter,
                             overlap=args.overlap)
    print(f"wrote {report.result}: {report.frames} frames from {len(files)} latent segments "
          f"({args.overlap}-frame overlaps, joined in latent space, one streaming decode)"
          + (f", {report.audio_samples} audio samples per channel" if report.audio_samples else ""))
    return 0


def run(args) -> int:
    """Join the segment files (or latent files with `--vae`) in `args` into `--out`; returns 0 once
    written. Raises InvalidInputError for segments that cannot be chained or an option that does not apply
    to the mode."""
    from h3director.av.stitch import stitch_files

    if args.vae:
        return _run_latents(args)

    report = stitch_files(args.segments, args.out, args.overlap, blend=args.blend or "crossfade", video_codec=args.codec,
                          audio_codec=args.audio_codec, crf=args.crf, preset=args.preset)
    if args.json:
        data = {k: (str(v) if k == "path" else v) for k, v in vars(report).items()}
        print(json.dumps(data, indent=2))
        return 0
    padded = sum(report.audio_padded)
    print(f"wrote {report.path}: {report.frames} frames from {report.segments} segments "
          f"({report.overlap}-frame overlaps, {report.blend}), {report.samples} audio samples per channel, "
          f"{report.video_codec} {report.pix_fmt} + {report.audio_codec}"
          + (f"; {padded} samples of silence padded at segment ends" if padded else "")
          + (f"; audio cross-fades: {', '.join(report.audio_fades)}" if report.audio_fades else "")
          + (f"; FFmpeg's decoder returns {report.decoded_samples} (the last AAC frame whole: the edit list states "
             f"{report.samples})" if report.decoded_samples != report.samples else ""))
    return 0


__all__ = ["HELP", "add_arguments", "run"]
