"""`h3director stitch SEG1 SEG2 ... --overlap 22 [--blend cut|crossfade] --out OUT.mp4`.

Joins chained segments that share `--overlap` frames into one file, streaming (see `h3director.av.stitch`):
``sum(frames) - (k - 1) x overlap`` frames, audio joined at the overlap's first frame with an equal-power
cross-fade over the overlap. `--codec h264-lossless` or `ffv1` (.mkv) with `--audio-codec pcm` keep every
frame and sample outside the overlaps exactly as decoded from the inputs.
"""

from __future__ import annotations

import json

HELP = "join chained segments that share N frames into one file (streaming, exact frame count, A/V in step)"


def add_arguments(parser) -> None:
    from h3director.av.stitch import AUDIO_CODECS, BLENDS, VIDEO_CODECS

    parser.add_argument("segments", nargs="+", help="segment files in chain order (2 or more)")
    parser.add_argument("--overlap", type=int, default=22, help="frames each segment shares with the next (22)")
    parser.add_argument("--blend", choices=BLENDS, default="crossfade",
                        help="video inside the overlap: cut (keep the earlier segment) or linear crossfade")
    parser.add_argument("--out", required=True, help="output file (.mp4, .mov or .mkv)")
    parser.add_argument("--codec", choices=VIDEO_CODECS, default="h264",
                        help="h264 (CRF, lossy), h264-lossless (qp 0) or ffv1 (.mkv)")
    parser.add_argument("--audio-codec", choices=AUDIO_CODECS, default=None,
                        help="aac (default with h264), pcm (default with the lossless codecs) or flac")
    parser.add_argument("--crf", type=int, default=18, help="libx264 CRF for --codec h264 (18)")
    parser.add_argument("--preset", default="medium", help="libx264 preset (medium)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    from h3director.av.stitch import stitch_files

    report = stitch_files(args.segments, args.out, args.overlap, blend=args.blend, video_codec=args.codec,
                          audio_codec=args.audio_codec, crf=args.crf, preset=args.preset)
    if args.json:
        data = {k: (str(v) if k == "path" else v) for k, v in vars(report).items()}
        print(json.dumps(data, indent=2))
        return 0
    padded = sum(report.audio_padded)
    print(f"wrote {report.path}: {report.frames} frames from {report.segments} segments "
          f"({report.overlap}-frame overlaps, {report.blend}), {report.samples} audio samples per channel, "
          f"{report.video_codec} {report.pix_fmt} + {report.audio_codec}"
          + (f"; {padded} samples of silence padded at segment ends" if padded else ""))
    return 0
