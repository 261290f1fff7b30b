"""How much does the monitor cost, and does it distort what it measures?

For each sampling interval (default 10, 50, 100, 500 ms) this measures, side by side in one run:

1. sampling rate: samples per second achieved against requested, while the main thread idles;
2. sampler cost: CPU time of the sampler thread per sample (microseconds) and as % of one core,
   for the in-process source (``host.rss_bytes``) and for the external process-tree source
   (``h3director monitor -- COMMAND``: psutil children + /proc per process);
3. effect on work: the wall time of a CPU-bound workload with the monitor running, as a ratio to
   the same workload without it (repeats interleaved, fastest taken). Two workloads: a pure-Python
   loop (holds the GIL: the worst case for a Python sampler thread) and a single-threaded torch
   matmul (releases the GIL, like real model work).

Run:  .venv/bin/python bench/monitor_overhead.py [--intervals 10 50 100 500] [--repeats 5]
Prints a Markdown table. Timings are ratios measured in one run on the same machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
from _results import table, write_results

from h3director.core.monitor import Monitor, ProcessTree


def python_workload() -> None:
    total = 0
    for i in range(7_000_000):
        total += i * i % 7


def torch_workload() -> None:
    a = torch.ones((512, 512))
    for _ in range(150):
        a = torch.mm(a, a).clamp_(max=1.0)


def sampling_rate(interval_ms: float, seconds: float, tree_pid: int | None) -> dict[str, float]:
    monitor = Monitor(interval_ms=interval_ms, devices=() if tree_pid else ("cpu",))
    if tree_pid:
        tree = ProcessTree(tree_pid)
        monitor.add_series("tree.rss_bytes", tree.rss_bytes)
        monitor.add_series("tree.processes", tree.process_count, unit="processes")
    with monitor:
        time.sleep(seconds)
    return monitor.report().overhead


def timed(workload, interval_ms: float | None) -> float:
    if interval_ms is None:
        start = time.perf_counter()
        workload()
        return time.perf_counter() - start
    with Monitor(interval_ms=interval_ms, devices=("cpu",)):
        start = time.perf_counter()
        workload()
        return time.perf_counter() - start


def slowdown(workload, interval_ms: float, repeats: int) -> tuple[float, float, float]:
    """(fastest seconds without, fastest with, ratio with/without); runs interleaved A B B A A B ...

    The fastest of several runs is taken because on a shared machine other jobs only ever add time.
    """
    without, with_monitor = [], []
    timed(workload, None)  # warm-up
    for i in range(repeats):
        order = (None, interval_ms) if i % 2 == 0 else (interval_ms, None)
        for setting in order:
            (without if setting is None else with_monitor).append(timed(workload, setting))
    a, b = min(without), min(with_monitor)
    return a, b, b / a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--intervals", type=float, nargs="+", default=[10, 50, 100, 500])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0, help="idle sampling time per interval (at least 10 samples)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "monitor_overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(1)

    # a small process tree for the external source: one child holding 64 MiB
    child = subprocess.Popen([sys.executable, "-c",
                              "import numpy as np, time; a = np.ones(64 * 1024**2, dtype=np.uint8); time.sleep(3600)"])
    try:
        time.sleep(0.5)
        rows = []
        for interval in args.intervals:
            seconds = max(args.seconds, 20 * interval / 1000.0)
            local = sampling_rate(interval, seconds, None)
            tree = sampling_rate(interval, seconds, child.pid)
            _, _, py_ratio = slowdown(python_workload, interval, args.repeats)
            _, _, th_ratio = slowdown(torch_workload, interval, args.repeats)
            rows.append((interval, local, tree, py_ratio, th_ratio))
            print(f"  measured {interval:g} ms", file=sys.stderr)
    finally:
        child.kill()
        child.wait()

    base_py = min(timed(python_workload, None) for _ in range(3))
    base_th = min(timed(torch_workload, None) for _ in range(3))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = f"{psutil.cpu_count(logical=True)} logical CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    print(f"Monitor overhead, {now}, {platform.machine()} {cpu}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
    print(f"Workloads without monitor: pure-Python loop {base_py:.2f} s, torch matmul (1 thread) {base_th:.2f} s; "
          f"{args.repeats} interleaved repeats, fastest of each.\n")
    cells = [[f"{interval:g} ms", f"{local['requested_hz']:.1f}", f"{local['achieved_hz']:.1f}",
              f"{local['missed_ticks']:.0f}", f"{local['cpu_per_sample_us']:.0f} us",
              f"{local['cpu_percent_of_core']:.2f} %", f"{tree['achieved_hz']:.1f}", f"{tree['cpu_per_sample_us']:.0f} us",
              f"{tree['cpu_percent_of_core']:.2f} %", f"{py_ratio:.3f}", f"{th_ratio:.3f}"]
             for interval, local, tree, py_ratio, th_ratio in rows]
    found = table(["interval", "requested /s", "achieved /s (in-process)", "missed ticks", "CPU per sample (in-process)",
                   "% of one core", "achieved /s (process tree)", "CPU per sample (process tree)", "% of one core",
                   "pure-Python loop with/without", "torch matmul with/without"], cells,
                  note=f"with/without = the workload's fastest wall time with the monitor over without, {args.repeats} "
                       f"interleaved repeats in one run (without: pure-Python loop {base_py:.2f} s, torch matmul, 1 "
                       f"thread, {base_th:.2f} s); load average {os.getloadavg()[0]:.1f}.")
    print("| " + " | ".join(found["columns"]) + " |")
    for cell in cells:
        print("| " + " | ".join(cell) + " |")
    figures = {}
    for interval, local, tree, _, _ in rows:
        figures[f"core_percent_{interval:g}ms"] = f"{local['cpu_percent_of_core']:.2f}%"
        figures[f"tree_core_percent_{interval:g}ms"] = f"{tree['cpu_percent_of_core']:.2f}%"
    write_results(args.out, "monitor_overhead", {"intervals": args.intervals, "repeats": args.repeats,
                                                 "seconds": args.seconds},
                  {"tables": {"overhead": found}, "figures": figures}, sources=("h3director/core/monitor.py",))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
