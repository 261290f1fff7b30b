"""Run a Python program under a `TransferLog` and write its log: what `h3director monitor --ops` starts.

    python -m h3director.commands.ops_runner --out OPS.json [--device DEV] -- (SCRIPT | -m MODULE | -c CODE) ARGS...

The program runs in this interpreter (``runpy``, with ``sys.argv`` as it would see it) on the main
thread under one `TransferLog`; ops of other threads are not counted. ``--device`` is the job's device
(default: ``cuda`` when available, else ``mps`` when available, else ``cpu``). OPS.json
(`TransferLog.to_dict()`) is written when the program ends, whatever the outcome; the exit code is the
program's.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path


def default_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    """Run the program after `--` (SCRIPT, -m MODULE or -c CODE, then its arguments) under a `TransferLog`
    on `--device` and write the log as JSON to `--out`, also when the program fails; returns its exit code
    (1 when it raised). `argv`: the arguments (default `sys.argv[1:]`); argparse exits with 2 on bad
    arguments."""
    parser = argparse.ArgumentParser(prog="python -m h3director.commands.ops_runner")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program or (program[0] in ("-m", "-c") and len(program) < 2):
        parser.error("give the program after --: SCRIPT, -m MODULE or -c CODE, then its arguments")

    from h3director.core.transfers import TransferLog

    log = TransferLog(args.device or default_device())
    code = 0
    try:
        with log:
            if program[0] == "-m":
                sys.argv = [program[1], *program[2:]]
                runpy.run_module(program[1], run_name="__main__", alter_sys=True)
            elif program[0] == "-c":
                sys.argv = ["-c", *program[2:]]
                exec(compile(program[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the user's own -c
            else:
                sys.argv = list(program)
                sys.path.insert(0, str(Path(program[0]).resolve().parent))
                runpy.run_path(program[0], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        from h3director.core.atomic_file import atomic_path

        with atomic_path(args.out) as temporary:
            temporary.write_text(json.dumps(log.to_dict(), indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
