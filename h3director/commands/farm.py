"""`h3director farm run JOBS.jsonl` / `h3director farm status`: the render farm on Ray (extra `farm`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from h3director.errors import InvalidInputError, missing_package

HELP = ("Render farm on Ray: run a JSONL batch of ComfyUI or diffusers H3 jobs placed by predicted memory; "
        "show a run's status.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director farm`'s options to `parser` (its argparse sub-parser)."""
    sub = parser.add_subparsers(dest="farm_command", metavar="{run,status}", required=True)
    run = sub.add_parser("run", help="run every job of a JSONL file (resumes an earlier run in the same --out)")
    run.add_argument("jobs", help="JSONL job file: one {\"id\", \"workflow\" or \"diffusers\", overrides...} "
                                  "object per line")
    run.add_argument("--address", default=None,
                     help="Ray cluster: ray://HOST:10001, HOST:PORT or auto; default (or 'local'): a Ray on this machine")
    run.add_argument("--out", default="farm_out", help="folder for outputs (OUT/<job id>/) and the ledger farm.sqlite")
    run.add_argument("--workers", default=None,
                     help="local devices NAME=ACCEL[:HOST],... e.g. gpu0=24GB,gpu1=12GB (those without HOST share this "
                          "machine's available RAM; default: one worker with "
                          "this machine's free accelerator memory, or its RAM on a CPU-only machine)")
    run.add_argument("--comfyui", default=os.environ.get("H3_FARM_COMFYUI"),
                     help="ComfyUI source folder on every node (env H3_FARM_COMFYUI); needed when the job file "
                          "has ComfyUI workflow jobs")
    run.add_argument("--comfy-python", default=os.environ.get("H3_FARM_COMFY_PYTHON", sys.executable),
                     help="Python with ComfyUI's requirements (env H3_FARM_COMFY_PYTHON; default: this one)")
    run.add_argument("--comfy-base", default=os.environ.get("H3_FARM_COMFY_BASE"),
                     help="ComfyUI base folder with models/ and custom_nodes/ (this pack installed) "
                          "(env H3_FARM_COMFY_BASE; default: the --comfyui folder)")
    run.add_argument("--dry-run", action="store_true",
                     help="price every job and print its rungs, need and placement on --workers (default: this "
                          "machine); start nothing (no Ray, no ComfyUI, no ledger)")
    run.add_argument("--cpu", action="store_true",
                     help="start the ComfyUI servers with --cpu and run diffusers jobs on the CPU")
    status = sub.add_parser("status", help="the ledger of a run: every job's state, worker, peaks and time")
    status.add_argument("--out", default="farm_out", help="the run's --out folder")


def _require_farm_extra() -> None:
    try:
        import ray  # noqa: F401
        import rich  # noqa: F401
    except ImportError as error:
        raise InvalidInputError(f"{missing_package('the farm', 'Ray and rich', 'farm')} ({error})") from None


def _default_workers():
    from h3director.farm.needs import WorkerSpec
    from h3director.plan.machine import detect_budget

    budget, _ = detect_budget("auto")
    return [WorkerSpec("local", budget.device_bytes, budget.host_bytes)]


def _workflow_lines(path: Path) -> list[int]:
    """The line numbers of the job file's lines that name a ComfyUI ``workflow`` (a cheap look, no checks)."""
    import json

    lines = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "workflow" in data:
            lines.append(number)
    return lines


def _run(args: argparse.Namespace) -> int:
    import psutil
    from rich.console import Console

    from h3director.farm.driver import run_farm
    from h3director.farm.needs import parse_workers
    from h3director.farm.worker import ServerConfig

    if not Path(args.jobs).is_file():
        raise InvalidInputError(f"job file {args.jobs!r} does not exist")
    if not args.comfyui:
        lines = _workflow_lines(Path(args.jobs))
        if lines:
            raise InvalidInputError("--comfyui (or H3_FARM_COMFYUI) must name the ComfyUI folder the workers start: "
                                    f"the job file has ComfyUI workflow jobs (lines {', '.join(map(str, lines[:10]))}"
                                    f"{', ...' if len(lines) > 10 else ''})")
    local = args.address in (None, "", "local")
    if local and args.comfyui and not (Path(args.comfyui) / "main.py").is_file():    # on a cluster the path is the nodes'
        raise InvalidInputError(f"--comfyui {args.comfyui!r} has no main.py: not a ComfyUI source folder")
    if args.workers and not local:
        raise InvalidInputError("--workers is for a local farm; cluster nodes declare their devices themselves")
    workers = []
    if local:
        workers = parse_workers(args.workers, psutil.virtual_memory().available) if args.workers \
            else _default_workers()
    comfyui = str(Path(args.comfyui).absolute()) if args.comfyui else ""
    config = ServerConfig(python=args.comfy_python, comfyui_dir=comfyui,
                          base_dir=str(Path(args.comfy_base or args.comfyui).absolute()) if comfyui else "", cpu=args.cpu)
    return run_farm(args.jobs, args.out, address=None if local else args.address, workers=workers,
                    config=config, console=Console())


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from h3director.farm.driver import LEDGER_NAME
    from h3director.farm.ledger import Ledger
    from h3director.farm.progress import counts_line, final_table

    path = Path(args.out) / LEDGER_NAME
    if not path.is_file():
        raise InvalidInputError(f"no farm ledger at {str(path)!r}: run `h3director farm run JOBS --out {args.out}`")
    console = Console()
    with Ledger(path) as ledger:
        console.print(final_table(ledger.rows(), title=f"H3 farm: {path}"))
        console.print(counts_line(ledger.counts()))
    return 0


def _dry_run(args: argparse.Namespace) -> int:
    import psutil

    from h3director.farm.driver import dry_run
    from h3director.farm.needs import comfy_model_dirs, parse_workers

    if not Path(args.jobs).is_file():
        raise InvalidInputError(f"job file {args.jobs!r} does not exist")
    if args.address not in (None, "", "local"):
        raise InvalidInputError("--dry-run prices against --workers (or this machine); it does not reach a cluster")
    workers = parse_workers(args.workers, psutil.virtual_memory().available) if args.workers else _default_workers()
    base = args.comfy_base or args.comfyui
    return dry_run(args.jobs, workers, model_dirs=comfy_model_dirs(base))


def run(args: argparse.Namespace) -> int:
    """Run a farm job file, price it (`--dry-run`) or show a farm's status; returns the exit code (0 when
    every job finished). Raises InvalidInputError for a missing job file, ComfyUI folder or ledger,
    conflicting options, or when the `farm` extra (Ray, rich) is not installed."""
    if args.farm_command == "status":
        return _status(args)
    if args.dry_run:
        return _dry_run(args)
    _require_farm_extra()
    return _run(args)


__all__ = ["HELP", "add_arguments", "run"]
