"""The `h3director` command line: parses arguments and hands them to one subcommand module.

Each subcommand lives in `h3director/commands/<name>.py` and provides

    HELP: str                                   one line for `h3director --help`
    def add_arguments(parser) -> None           fills its argparse sub-parser
    def run(args) -> int                        does the work, returns the exit code

Modules are imported only when their command runs (or when `--help` lists them), so the tool
starts fast and a missing optional package only affects the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from h3director import __version__
from h3director.errors import H3DirectorError

# Command name -> module under h3director.commands. Order is the order of `--help`.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "decode": "decode",
    "plan": "plan",
    "monitor": "monitor",
    "oom": "oom",
    "doctor": "doctor",
    "config": "config",
    "verify-kernels": "verify_kernels",
    "weights": "weights",
    "avsync": "avsync",
    "stitch": "stitch",
    "upscale": "upscale",
    "farm": "farm",
}


def _load(module_name: str):
    return importlib.import_module(f"h3director.commands.{module_name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that command's module is imported (fast path for `main`)."""
    parser = argparse.ArgumentParser(
        prog="h3director",
        description="H3 Director: bounded, visible memory for long MiniMax H3 video generation.",
    )
    parser.add_argument("--version", action="version", version=f"h3director {__version__}")
    # A dest no subcommand uses for itself: `monitor -- CMD` has a positional named "command".
    sub = parser.add_subparsers(dest="_command_name", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, add_help=False)
            continue
        try:
            module = _load(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("h3director.commands"):
                continue  # command not built yet in this checkout
            raise
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `h3director` with `argv` (default `sys.argv[1:]`); returns the exit code: the command's own, 2 for
    an `H3DirectorError` (printed as one line) or bad usage, 130 when interrupted, 141 when stdout's reader
    went away."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=chosen)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2 if chosen is None and argv else 0
    try:
        return int(args._run(args) or 0)
    except H3DirectorError as exc:
        print(f"h3director {args._command_name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"h3director {args._command_name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`h3director config show | head`): stop quietly, as Unix tools do.
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


__all__ = ["main"]
