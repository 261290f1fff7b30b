"""`h3director avsync measure|fix`: measure a file's A/V offset, or write a copy with it removed."""

from __future__ import annotations

import argparse
import json

from h3director.errors import InvalidInputError

HELP = "Measure the audio/video offset of a file (positive = audio late) or write a copy with it removed."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director avsync`'s options to `parser` (its argparse sub-parser)."""
    actions = parser.add_subparsers(dest="avsync_action", metavar="ACTION", required=True)
    measure = actions.add_parser(
        "measure", help="measure the offset: sound onsets against picture motion, whole file and per window")
    measure.add_argument("file", help="media file with a video and an audio stream")
    measure.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_search(measure)

    fix = actions.add_parser("fix", help="write a copy with the offset removed (audio moved by samples by default)")
    fix.add_argument("file", help="media file with a video and an audio stream")
    fix.add_argument("--offset", default="auto",
                     help="offset to remove in ms (positive = audio late), or 'auto' to measure it first")
    fix.add_argument("--out", required=True, help="output file (.mp4, .mov or .mkv), written atomically")
    fix.add_argument("--by-frames", action="store_true",
                     help="move the picture by whole frames (re-encoded) instead of the sound by samples")
    fix.add_argument("--crf", type=int, default=18, help="libx264 quality for --by-frames (0..51, default 18)")
    fix.add_argument("--json", action="store_true", help="print what was done as JSON")
    _add_search(fix)


def _add_search(parser: argparse.ArgumentParser) -> None:
    from h3director.av.measure import DEFAULT_MAX_OFFSET_MS, DEFAULT_WINDOW_S

    parser.add_argument("--max-offset-ms", type=float, default=DEFAULT_MAX_OFFSET_MS,
                        help=f"search offsets within +- this many ms (default {DEFAULT_MAX_OFFSET_MS:g})")
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S,
                        help=f"window length in seconds for the per-window offsets (default {DEFAULT_WINDOW_S:g})")


def _format(path: str, result) -> str:
    if not result.usable:
        return f"{path}: {result.reason}"
    lines = [f"{path}: offset {result.offset_ms:+.1f} ms ({'audio late' if result.offset_ms >= 0 else 'audio early'}),"
             f" confidence {result.confidence:.2f} ({result.pairs} of {min(result.picture_events, result.sound_events)} "
             "events paired)"
             + ("" if result.reason == "ok" else f"; {result.reason}")]
    if result.drift_ms_per_min is not None:
        lines.append(f"drift: {result.drift_ms_per_min:+.1f} ms per minute along the file")
    for window in result.windows:
        value = "no usable events" if window.offset_ms is None else f"{window.offset_ms:+.1f} ms"
        lines.append(f"  {window.start_s:8.2f}-{window.end_s:8.2f} s  {value:>17}  confidence {window.confidence:.2f}")
    return "\n".join(lines)


def _measure(args: argparse.Namespace):
    from h3director.av.measure import measure_file

    return measure_file(args.file, max_offset_ms=args.max_offset_ms, window_s=args.window_s)


def run(args: argparse.Namespace) -> int:
    """Measure or fix the file in `args`; returns the exit code: 0, or 1 when `measure` found no usable
    offset.

    Raises InvalidInputError for a missing or unreadable file, a bad `--offset`, or `fix` without a usable
    offset."""
    if args.avsync_action == "measure":
        result = _measure(args)
        if args.json:
            print(json.dumps({"file": args.file, **result.to_dict()}, indent=2))
        else:
            print(_format(args.file, result))
        return 0 if result.usable else 1
    return _fix(args)


def _fix(args: argparse.Namespace) -> int:
    from h3director.av.measure import LOW_CONFIDENCE
    from h3director.av.media import probe
    from h3director.av.shift import shift_audio_file, shift_video_file

    if args.offset == "auto":
        probe(args.file)  # refuse a bad file before measuring
        result = _measure(args)
        if not result.usable:
            raise InvalidInputError(f"{args.file}: {result.reason}; pass --offset MS to apply a known offset")
        if result.confidence < LOW_CONFIDENCE:
            raise InvalidInputError(
                f"{args.file}: the measured offset {result.offset_ms:+.1f} ms has low confidence "
                f"({result.confidence:.2f} < {LOW_CONFIDENCE}); pass --offset {result.offset_ms:.1f} to apply it anyway")
        offset_ms = result.offset_ms
    else:
        try:
            offset_ms = float(args.offset)
        except ValueError:
            raise InvalidInputError(f"--offset must be 'auto' or a number of ms, got {args.offset!r}") from None
    if args.by_frames:
        report = shift_video_file(args.file, args.out, offset_ms, crf=args.crf)
        moved = f"picture moved by {report.frames:+d} frames at {report.fps:g} fps"
    else:
        report = shift_audio_file(args.file, args.out, offset_ms)
        moved = f"sound moved by {report.samples:+d} samples at {report.sample_rate} Hz"
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{report.path}: removed {offset_ms:+.1f} ms ({moved})")
    return 0


__all__ = ["HELP", "add_arguments", "run"]
