"""What `h3director demo` prints, as a results file: the stock decode vs the director's, each phase in its own process.

    .venv/bin/python bench/demo_memory.py [--frames 124] [--size 640x384] [--out bench/results/demo_memory.json]

Runs `h3director demo` (small random-initialised configs of the real diffusers H3 video and audio VAEs, CPU;
see h3director/commands/demo.py) in a subprocess and records its table: each phase's peak resident memory above
the phase's own starting point (exact high-water mark, reset in the phase's process) and wall time, the memory
ratio, and the demo's exactness checks. Fails if the demo fails a check. The README and docs/BENCHMARKS.md
render the table from the results file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import table, write_results

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("h3director/commands/demo.py", "h3director/video", "h3director/integrations/diffusers_h3.py",
           "h3director/integrations/diffusers_h3_audio.py", "h3director/integrations/stock_h3.py",
           "h3director/integrations/tiny.py", "h3director/core/host_heap.py")


def parse(printed: str) -> dict:
    """The demo's printed table -> {"phases": [[phase, peak, wall], ...], "summary": the ratio line, "checks":
    [[check, verdict], ...]}; raises ValueError when the output is not the demo's table."""
    lines = printed.splitlines()
    phases = []
    for line in lines:
        if line.startswith(("stock (", "director (")):
            cells = re.split(r"\s{2,}", line.strip())
            phases.append(cells[:3])
    summary = next((line for line in lines if line.startswith("memory: director needs")), None)
    checks = [line.rsplit(": ", 1) for line in lines if line.startswith(("identical", "audio within"))]
    if len(phases) != 2 or summary is None or not checks:
        raise ValueError(f"not the demo's table:\n{printed}")
    return {"phases": phases, "summary": summary, "checks": checks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--size", default="640x384")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "demo_memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="h3-demo-bench-") as folder:
        done = subprocess.run([sys.executable, "-m", "h3director", "demo", "--out", folder, "--frames",
                               str(args.frames), "--size", args.size], capture_output=True, text=True, cwd=REPO)
    print(done.stdout)
    if done.returncode != 0:
        print(done.stderr[-4000:], file=sys.stderr)
        return done.returncode
    found = parse(done.stdout)
    ratio = re.search(r"needs ([0-9.]+)x less", found["summary"]).group(1)
    tables = {"phases": table(["phase", "peak memory above baseline", "wall time"], found["phases"],
                              note=f"`h3director demo --frames {args.frames} --size {args.size}`, each phase in a "
                                   f"process of its own; {found['summary']}. Checks: "
                                   + "; ".join(f"{what}: {verdict}" for what, verdict in found["checks"]) + ".")}
    write_results(args.out, "demo_memory", {"frames": args.frames, "size": args.size},
                  {"tables": tables, "figures": {"ratio": f"{ratio}x"}, "printed": done.stdout}, sources=SOURCES)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
