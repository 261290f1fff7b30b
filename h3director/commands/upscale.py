"""`h3director upscale IN --model MODEL.pth|.safetensors --out OUT.mp4|.npy [--tile 512] [--overlap auto|N]
[--pre-resize WxH [--pre-resample area|lanczos|bicubic]] [--post-resize WxH [--resample lanczos|area|bicubic]]
[--dtype fp32|fp16|bf16] [--tile-batch N]`.

Upscales (or, with a 1x model, restores) a video file or a `.npy` of uint8 frames ``[F, H, W, 3]`` frame by frame,
tile by tile, with a spandrel model (as ComfyUI loads them), each finished frame straight into the output
(`h3director.video.upscale`). `--pre-resize` resizes each frame before the model and `--post-resize` each result to
the target size (restoring a 4K video at 1080p and Lanczos back up). A video input's audio is copied into a video
output unchanged. Every check (output kind, sizes, filters, dtype, input, model, tiling, an existing output) runs
before the first frame is read.
"""

from __future__ import annotations

import json
from pathlib import Path

HELP = "upscale a video or .npy frame by frame with a spandrel model, exact tile seams, straight to .mp4/.npy"


def add_arguments(parser) -> None:
    """Add `h3director upscale`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("input", help="video file (.mp4, .mov, .mkv, ...) or .npy of uint8 frames [F, H, W, 3]")
    parser.add_argument("--model", required=True, help="upscale model (.pth, .pt, .ckpt or .safetensors) spandrel loads")
    parser.add_argument("--out", required=True, help="output: .mp4/.mov/.mkv (H.264, audio copied) or .npy (uint8)")
    parser.add_argument("--tile", type=int, default=512, help="largest tile side in input pixels (512)")
    parser.add_argument("--overlap", default="auto",
                        help="context each tile gets on every side, input pixels, or 'auto': the model's receptive "
                             "field (exact seams for convolutional models)")
    parser.add_argument("--pre-resize", default=None, metavar="WxH",
                        help="resize each frame to WxH before the model (even sides), e.g. a 4K video to 1920x1080")
    parser.add_argument("--pre-resample", default=None, metavar="FILTER",
                        help="filter of --pre-resize: area (default), lanczos or bicubic (Pillow, deterministic)")
    parser.add_argument("--post-resize", default=None, metavar="WxH",
                        help="resize each model output to WxH (even sides), the target size")
    parser.add_argument("--resample", default=None, metavar="FILTER",
                        help="filter of --post-resize: lanczos (default), area or bicubic (Pillow, deterministic)")
    parser.add_argument("--dtype", default="fp32",
                        help="model dtype: fp32 (default), fp16 or bf16 (approximate: the report gives the measured "
                             "difference from fp32)")
    parser.add_argument("--tile-batch", default="1", metavar="N",
                        help="tiles of equal size per model call (1); a batch that runs out of memory is halved")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--fps", type=float, default=None, help="frame rate of a .npy input (24) or an override")
    parser.add_argument("--crf", type=int, default=18, help="libx264 CRF of a video output (18; 0 = lossless)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted .npy output of the same job (and allow replacing an existing "
                             "output)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _check_output(args) -> Path:
    from h3director.errors import InvalidInputError
    from h3director.video.sinks import FILE_SINK_KINDS

    out = Path(args.out)
    if out.suffix.lower() not in FILE_SINK_KINDS:
        raise InvalidInputError(f"--out {args.out!r}: use one of {', '.join(sorted(FILE_SINK_KINDS))}")
    if out.exists() and not args.resume:
        raise InvalidInputError(f"--out {args.out!r} exists; delete it or pass --resume")
    if not out.parent.is_dir():
        raise InvalidInputError(f"--out {args.out!r}: folder {str(out.parent)!r} does not exist")
    return out


def run(args) -> int:
    """Upscale the input file in `args` with the model into `--out`; returns 0 once written. Raises
    InvalidInputError for a bad output path, `--overlap`, tiling, dtype or model, before any frame is read."""
    from h3director.errors import InvalidInputError
    from h3director.integrations.spandrel_models import load_upscale_model
    from h3director.video.sinks import file_sink_for
    from h3director.video.upscale import Recipe, job_key, prepare, stream_upscale
    from h3director.video.upscale_audio import AudioCopyVideoSink
    from h3director.video.upscale_sources import open_source
    from h3director.video.upscale_stages import parse_dtype

    out = _check_output(args)
    recipe = Recipe.build(pre_resize=args.pre_resize, pre_resample=args.pre_resample, post_resize=args.post_resize,
                          resample=args.resample, tile_batch=args.tile_batch)
    dtype = parse_dtype(args.dtype)
    if args.overlap != "auto":
        try:
            args.overlap = int(args.overlap)
        except ValueError:
            raise InvalidInputError(f"--overlap must be 'auto' or a number of pixels, got {args.overlap!r}") from None
    source = open_source(args.input, fps=args.fps)
    model = load_upscale_model(args.model, device=args.device, dtype=dtype)
    overlap, _, exact = prepare(model, source, args.tile, args.overlap, recipe)
    if out.suffix.lower() == ".npy":
        sink = file_sink_for(out, resume=args.resume, job=job_key(model, source, args.tile, overlap, exact, recipe))
    elif source.audio_path is not None:
        sink = AudioCopyVideoSink(out, source.audio_path, fps=source.fps, crf=args.crf)
    else:
        sink = file_sink_for(out, fps=source.fps, crf=args.crf)
    report = stream_upscale(model, source, sink, tile=args.tile, overlap=args.overlap, recipe=recipe)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print("\n".join(report.lines()))
    return 0


__all__ = ["HELP", "add_arguments", "run"]
