"""`h3director oom FILE|-`: explain every out-of-memory error in a log (CUDA, MPS, CPU)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from h3director.errors import InvalidInputError

HELP = "Explain every out-of-memory error in a log: what was requested, what was free, and what to change."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director oom`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("file", help="log file to read, or - for standard input")
    parser.add_argument("--ram", default=None,
                        help="host RAM of the machine that ran the job, e.g. 64GB, for the planner's settings "
                             "(default: this machine's total RAM)")
    parser.add_argument("--target", default="comfyui", choices=("comfyui", "diffusers"),
                        help="name the settings as ComfyUI nodes (default) or diffusers calls")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def _read(path: str) -> str:
    from h3director.core.oom import MAX_LOG_CHARS

    if path == "-":
        return sys.stdin.read(MAX_LOG_CHARS)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            if size > MAX_LOG_CHARS:  # the error is usually at the end of a long log
                handle.seek(size - MAX_LOG_CHARS)
            return handle.read(MAX_LOG_CHARS).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InvalidInputError(f"cannot read log {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    """Explain every out-of-memory error in the log file (or stdin for "-"); returns 0 when each was
    understood, 1 otherwise. Raises InvalidInputError when the log cannot be read."""
    from h3director.core.oom import OomError, explain_log, format_explanations
    from h3director.plan.oom_advice import advise
    from h3director.units import parse_size

    if args.ram:
        host, source = parse_size(args.ram, binary_gb=True), ""
    else:
        import psutil

        host, source = int(psutil.virtual_memory().total), " (this machine's; pass --ram)"
    items = explain_log(_read(args.file))
    advise(items, host_bytes=host, target=args.target, host_source=source)
    if args.json:
        print(json.dumps({"file": args.file, "errors": [item.to_dict() for item in items]}, indent=2))
    else:
        print(format_explanations(items))
    # 0: every OOM-like line explained (or none found); 1: something was not understood
    return 0 if all(isinstance(item, OomError) for item in items) else 1


__all__ = ["HELP", "add_arguments", "run"]
