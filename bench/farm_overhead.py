"""Farm scheduling overhead: a batch of identical ComfyUI decode jobs run directly vs through the farm.

    .venv/bin/python bench/farm_overhead.py [--jobs 16] [--size 256] [--frames 39] [--rounds 2]

Both sides use the same ComfyUI (the vendored snapshot in `.comfy/`, `--cpu`, the tiny H3 VAEs of
`fixtures/comfy_harness/farm_base.py`) and the same job: an empty H3 AV latent decoded to an MP4 by
`H3DirectorDecodeAVStreaming`, each job with its own output prefix (as the farm gives it) and the same
settings (the farm's first rung that the worker fits, e.g. the decode node's `budget_gb`).

- direct: one server (`h3director.farm.comfy_server.ComfyServer`), the jobs submitted one after the
  other, each output written to the out folder with write-then-rename;
- farm: a local Ray with one worker whose capacity fits one job at a time, the same jobs as Ray
  tasks (`Farm.run`: ledger, resources, progress lines, outputs written the same way).

Timed is the batch only (first submission to last output written), not the start of Ray or of the
servers, which a long batch pays once. Rounds alternate direct and farm; the ratio is farm / direct
of the summed batch times. Both servers run with OMP_NUM_THREADS=1 (Ray's default for its workers).
Prints a Markdown table and writes bench/results/farm_overhead.json (`--out`): table `rounds`, figure `ratio`
(BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixtures"))
os.environ.setdefault("COMFYUI_DIR", str(REPO / ".comfy" / "ComfyUI"))
os.environ.setdefault("COMFYUI_PYTHON", str(REPO / ".comfy" / "venv" / "bin" / "python"))
os.environ["OMP_NUM_THREADS"] = "1"   # what Ray gives its workers by default; the direct server gets the same
sys.path.insert(0, str(REPO / "bench"))
from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/farm",)


def _jobs_file(folder: Path, count: int, size: int, frames: int, tag: str) -> Path:
    from comfy_harness.farm_base import write_decode_workflow

    workflow = write_decode_workflow(folder / "decode.json")
    path = folder / f"jobs-{tag}.jsonl"
    path.write_text("".join(json.dumps({"id": f"{tag}-{i:03d}", "workflow": workflow.name, "width": size,
                                        "height": size, "frames": frames}) + "\n" for i in range(count)))
    return path


def _direct(server, jobs_path: Path, out: Path, workers: list) -> float:
    """The jobs one after the other on one server, each with the settings the farm would apply (its first
    rung that a worker fits), priced before the clock starts as the farm's `prepare` is."""
    from h3director.farm import needs
    from h3director.farm.driver import _write_outputs
    from h3director.farm.jobs import read_jobs, with_output_prefix

    jobs, errors = read_jobs(jobs_path)
    assert not errors, errors
    workflows = []
    for job in jobs:
        rungs = needs.ladder(job)
        workflows.append(needs.apply_rung(rungs[needs.first_rung(rungs, workers)], job.workflow))
    started = time.perf_counter()
    for job, workflow in zip(jobs, workflows, strict=True):
        result = server.run(with_output_prefix(workflow, job.id))
        assert result.status == "done", result.error
        _write_outputs(out, job.id, result.files)
    return time.perf_counter() - started


def _farm(session, jobs_path: Path, out: Path, known: set[str]) -> float:
    from rich.console import Console

    from h3director.farm.driver import LEDGER_NAME, Farm
    from h3director.farm.jobs import read_jobs
    from h3director.farm.ledger import Ledger
    from h3director.farm.progress import Display

    jobs, _ = read_jobs(jobs_path)
    with Ledger(out / LEDGER_NAME) as ledger, Display(Console(file=open(os.devnull, "w")), ledger) as display:
        farm = Farm(session, ledger, out, display)
        items = farm.prepare(jobs, known)
        started = time.perf_counter()
        farm.run(items)
        seconds = time.perf_counter() - started
        assert ledger.counts()["done"] == len(jobs), ledger.counts()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--size", type=int, default=256, help="latent canvas in pixels (square, multiple of 32)")
    parser.add_argument("--frames", type=int, default=39, help="frames on the 17n+5 grid")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "farm_overhead.json")
    args = parser.parse_args()

    from comfy_harness.farm_base import prepare_farm_base

    from h3director.farm import needs
    from h3director.farm.comfy_server import ComfyServer
    from h3director.farm.driver import connect, start_workers
    from h3director.farm.worker import ServerConfig
    from h3director.units import GiB

    root = Path(tempfile.mkdtemp(prefix="h3farm-bench-"))
    base = prepare_farm_base(root / "base")
    config = ServerConfig(python=os.environ["COMFYUI_PYTHON"], comfyui_dir=os.environ["COMFYUI_DIR"],
                          base_dir=str(base), cpu=True)
    probe = _jobs_file(root, 1, args.size, args.frames, "probe")
    from h3director.farm.jobs import read_jobs

    need = needs.ladder(read_jobs(probe)[0][0])[0]
    worker = needs.WorkerSpec("w0", int(need.device_bytes * 1.5), 8 * GiB)   # one job at a time
    direct_server = ComfyServer(config.python, config.comfyui_dir, config.base_dir, str(root / "direct"),
                                cpu=True).start()
    session = connect(None, [worker])
    try:
        known = start_workers(session, config)
        warm = _jobs_file(root, 2, args.size, args.frames, "warm")      # load the VAEs on both servers
        _direct(direct_server, warm, root / "out-warm-direct", [worker])
        _farm(session, warm, root / "out-warm-farm", known)
        direct_s = farm_s = 0.0
        rows = []
        for r in range(args.rounds):
            d = _direct(direct_server, _jobs_file(root, args.jobs, args.size, args.frames, f"d{r}"), root / f"od{r}",
                        [worker])
            f = _farm(session, _jobs_file(root, args.jobs, args.size, args.frames, f"f{r}"), root / f"of{r}", known)
            direct_s, farm_s = direct_s + d, farm_s + f
            rows.append((r, d, f))
    finally:
        session.close()
        direct_server.stop()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    body = [[r, f"{d:.2f}", f"{f:.2f}", f"{f / d:.3f}"] for r, d, f in rows]
    body.append(["all", f"{direct_s:.2f}", f"{farm_s:.2f}", f"**{farm_s / direct_s:.3f}**"])
    rounds = table(["round", "direct (s)", "farm (s)", "farm / direct"], body,
                   f"{args.jobs} jobs per batch, each a {args.size}x{args.size}x{args.frames} decode to MP4 in a CPU "
                   f"ComfyUI, one worker, {args.rounds} rounds alternating direct and farm; the batch time only (not "
                   f"the start of Ray or the servers). Load average {load} when the run ended.")
    ratio = (f"farm / direct = {farm_s / direct_s:.3f} over {args.rounds} x {args.jobs} jobs of a "
             f"{args.size}x{args.size}x{args.frames} decode")
    print(table_markdown(rounds))
    write_results(args.out, "farm_overhead", {k: v for k, v in vars(args).items() if k != "out"},
                  {"rounds_s": [{"round": r, "direct": d, "farm": f} for r, d, f in rows], "load_average": load,
                   "tables": {"rounds": rounds}, "figures": {"ratio": ratio}}, sources=SOURCES)


if __name__ == "__main__":
    main()
