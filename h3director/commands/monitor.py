"""`h3director monitor [--interval MS] [--out DIR] [--budget SIZE] -- COMMAND ...`

Runs COMMAND, samples the memory of its whole process tree from outside (host RSS summed over
the process and its descendants; GPU memory per process through NVML where available), and
writes ``report.json``, ``report.csv`` and ``timeline.png`` into ``--out``. The exit code is
COMMAND's (128 + N when a signal N killed it). The report is written whatever the outcome; that
``--out`` can take it (a folder, created if missing, that a file can be written into, with no
folder in the way of a report file) is checked before COMMAND starts.

With ``--ops`` (COMMAND must be ``python SCRIPT ...``, ``python -m MODULE ...`` or ``python -c CODE``)
the program runs under an op and transfer log (`h3director.core.transfers`, installed in the child
interpreter by `h3director.commands.ops_runner`): host<->device copies, synchronising calls and CPU ops
per phase, written to ``ops.json`` and printed as a table of each phase's worst offenders. The log
needs to run inside the interpreter, so other commands are refused with ``--ops``.

Without COMMAND, ``--synthetic`` runs a built-in workload in this process (phases that load,
sample, decode and free known amounts of memory) to show what a report looks like.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from h3director.units import MiB, format_size, parse_size

HELP = "Run a command (or a built-in synthetic workload) and record its memory timeline: JSON, CSV, PNG."

DEFAULT_OUT = "h3director-monitor"
REPORT_FILES = ("report.json", "report.csv", "timeline.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director monitor`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("--interval", type=float, default=None, metavar="MS",
                        help="sampling interval in milliseconds (default: monitor.update_interval_ms of the config, "
                             "50 for --synthetic)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"report directory (default: ./{DEFAULT_OUT})")
    parser.add_argument("--budget", default=None, metavar="SIZE", help="draw a budget line, e.g. 8GB or 512MiB")
    parser.add_argument("--synthetic", action="store_true",
                        help="run the built-in synthetic workload instead of a command")
    parser.add_argument("--no-plot", action="store_true", help="skip timeline.png")
    parser.add_argument("--ops", action="store_true",
                        help="also log host<->device copies, synchronising calls and CPU ops (a Python COMMAND only)")
    parser.add_argument("--ops-device", default=None, metavar="DEV",
                        help="the job's device for --ops (default: cuda, else mps, else cpu, as the child sees them)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command to run, after --")


def _interval_ms(args: argparse.Namespace) -> float:
    if args.interval is not None:
        return args.interval
    if args.synthetic:
        return 50.0
    from h3director.core.config import load_config

    return float(load_config().monitor.update_interval_ms)


def check_report_folder(out: str | os.PathLike, *, plot: bool = True) -> Path:
    """Make sure ``out`` can take the report before any work starts; returns it as an absolute path.

    ``out`` must be a folder (it and its parents are created if missing) into which this process can
    write a file, with nothing but a plain file where ``report.json``, ``report.csv`` (and, with
    ``plot``, ``timeline.png``) go: an existing report is replaced. Raises `InvalidInputError`.
    """
    from h3director.errors import InvalidInputError

    out = Path(out).expanduser().absolute()
    shown = f"--out {str(out)!r}"
    for folder in (out, *out.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise InvalidInputError(f"{shown}: {str(folder)!r} is a file, not a folder; the report needs a folder")
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"{shown}: cannot create the report folder: {exc.strerror or exc}") from None
    for name in REPORT_FILES if plot else REPORT_FILES[:2]:
        target = out / name
        if target.exists() and not target.is_file():
            raise InvalidInputError(f"{shown}: {name} there is not a plain file (a folder?), so the report cannot "
                                    "replace it")
    try:
        handle, probe = tempfile.mkstemp(dir=out, prefix=".h3director-probe-")
    except OSError as exc:
        raise InvalidInputError(f"{shown}: cannot write into the folder: {exc.strerror or exc}") from None
    os.close(handle)
    os.unlink(probe)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the command after `--` (or the synthetic workload) under a `Monitor` and write its report into the
    `--out` folder; returns the command's exit code (127 when it cannot be started).

    Raises InvalidInputError for neither or both of a command and `--synthetic`, `--ops` without a Python
    command, a bad `--budget`/`--interval`, or a report folder that cannot be written."""
    from h3director.core.monitor import Monitor, ProcessTree
    from h3director.errors import InvalidInputError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.ops and args.synthetic:
        raise InvalidInputError("--ops logs a Python command's ops; the synthetic workload has none (numpy only)")
    if bool(command) == bool(args.synthetic):
        raise InvalidInputError("give either a command after '--' (h3director monitor -- python train.py) or --synthetic")
    budget = parse_size(args.budget, binary_gb=True) if args.budget else None
    interval = _interval_ms(args)
    out = check_report_folder(args.out, plot=not args.no_plot)

    if args.synthetic:
        monitor = Monitor(interval_ms=interval, devices=("cpu",), budget_bytes=budget)
        with monitor:
            run_synthetic_workload(monitor)
        report = monitor.report({"command": "synthetic workload", "exit_code": 0})
        return _write(report, out, args.no_plot, exit_code=0)

    env = None
    if args.ops:
        command, env = ops_command(command, out / "ops.json", args.ops_device)
    monitor = Monitor(interval_ms=interval, devices=(), budget_bytes=budget)
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"h3director monitor: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    tree = ProcessTree(child.pid)
    monitor.add_series("tree.rss_bytes", tree.rss_bytes)
    from h3director.core.devices import nvml_available

    if nvml_available():
        monitor.add_series("tree.gpu_bytes", tree.gpu_bytes)
    monitor.add_series("tree.processes", tree.process_count, unit="processes")

    previous_term = _forward_sigterm(child)
    started = time.time()
    try:
        with monitor:
            while True:
                try:
                    child.wait()
                    break
                except KeyboardInterrupt:  # the child got the same SIGINT from the terminal; wait for it
                    continue
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    metadata = {"command": command, "pid": child.pid, "exit_code": code, "started_wall": started,
                "largest_process_peak_rss_bytes": tree.largest_peak_rss_bytes(),
                "kernel_children_maxrss_bytes": _kernel_children_maxrss()}
    report = monitor.report(metadata)
    if args.ops:
        _print_ops(out / "ops.json")
    return _write(report, out, args.no_plot, exit_code=code)


PYTHON_NAME = re.compile(r"python[0-9.]*(\.exe)?$")


def ops_command(command: list[str], ops_json: Path, device: str | None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run a Python ``command`` under the ops runner.

    Refuses (`InvalidInputError`) a command that is not ``python SCRIPT|-m MODULE|-c CODE ...``: the log
    hooks into the interpreter, so it cannot follow other programs.
    """
    from h3director.errors import InvalidInputError

    python = len(command) >= 2 and PYTHON_NAME.search(Path(command[0]).name) is not None
    if not python or (command[1] in ("-m", "-c") and len(command) < 3) or \
            (command[1].startswith("-") and command[1] not in ("-m", "-c")):
        raise InvalidInputError(f"--ops needs a Python command (python SCRIPT ..., python -m MODULE ..., python -c "
                                f"CODE): the op log runs inside the interpreter; got {' '.join(command)!r}")
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    runner = [command[0], "-m", "h3director.commands.ops_runner", "--out", str(ops_json)]
    if device:
        runner += ["--device", device]
    return [*runner, "--", *command[1:]], env


def _print_ops(ops_json: Path) -> None:
    import json

    from h3director.core.transfers import format_table

    if not ops_json.is_file():
        print(f"h3director monitor: no op log at {ops_json} (the program did not get to start?)", file=sys.stderr)
        return
    table = format_table(json.loads(ops_json.read_text()))
    (ops_json.parent / "ops.txt").write_text(table + "\n")
    print(table)


def _forward_sigterm(child: subprocess.Popen):
    """Pass SIGTERM on to the child (so `kill h3director` stops the job and still writes the report)."""
    try:
        return signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    except ValueError:  # not the main thread
        return None


def _kernel_children_maxrss() -> int | None:
    """getrusage(RUSAGE_CHILDREN).ru_maxrss in bytes: the largest waited-for child's peak RSS.

    On Linux this count survives fork+exec, so it is never below this monitor's own RSS when it
    started the child; `ProcessTree.largest_peak_rss_bytes` (VmHWM) has no such floor.
    """
    from h3director.core.devices import ru_maxrss_bytes

    return ru_maxrss_bytes(children=True)


def _write(report, out: Path, no_plot: bool, *, exit_code: int) -> int:
    paths = [report.to_json(out / "report.json"), report.to_csv(out / "report.csv")]
    if not no_plot:
        paths.append(report.plot(out / "timeline.png", title=_title(report)))
    print(report.summary_table())
    peak = report.metadata.get("largest_process_peak_rss_bytes")
    if peak:
        print(f"largest single process's peak RSS (kernel high-water mark, not sampled): {format_size(peak)}")
    print("wrote " + ", ".join(str(p) for p in paths))
    if exit_code:
        print(f"h3director monitor: the command exited with {exit_code}", file=sys.stderr)
    return exit_code


def _title(report) -> str:
    command = report.metadata.get("command")
    text = " ".join(command) if isinstance(command, list) else str(command)
    return text if len(text) <= 90 else text[:87] + "..."


def run_synthetic_workload(monitor, *, scale_mib: int = 128, pause_s: float = 0.15) -> dict[str, int]:
    """A stand-in for one generation, in phases with known host allocations (bytes touched, so resident).

    ``load``: weights of 2 x scale; ``sample``: 6 steps, each a transient activation of 1 x scale on
    top of the weights; ``decode``: frames accumulate clip by clip, 4 clips of 0.5 x scale; ``after``:
    everything released before it starts. Returns the bytes each phase holds at its peak.
    """
    import numpy as np

    unit = scale_mib * MiB
    with monitor.phase("load"):
        weights = np.ones(2 * unit, dtype=np.uint8)
        time.sleep(pause_s)
    with monitor.phase("sample"):
        for _ in range(6):
            activation = np.ones(unit, dtype=np.uint8)
            time.sleep(pause_s / 2)
            del activation
    with monitor.phase("decode"):
        clips = []
        for _ in range(4):
            clips.append(np.ones(unit // 2, dtype=np.uint8))
            time.sleep(pause_s / 2)
    del weights, clips
    with monitor.phase("after"):
        time.sleep(pause_s)
    return {"load": 2 * unit, "sample": 3 * unit, "decode": 4 * unit, "after": 0}


__all__ = ["HELP", "add_arguments", "ops_command", "run"]
