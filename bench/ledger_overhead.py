"""What the per-prompt memory ledger costs in a real ComfyUI (vendored, --cpu), from its own accounting.

Starts ComfyUI with the pack and the ledger's test nodes (`fixtures/comfy_harness/ledger_real_node`, the tiny H3
VAEs of `real_node`), `--cache-lru 64`, and runs, in order:

1. ``decode``: the streaming decode of an empty 22-frame 128x128 H3 AV latent to an MP4 with the tiny VAEs
   (a model loaded and kept by ComfyUI: the ledger walks its weights), ``--prompts`` times, each with another
   frame rate so that ComfyUI runs the decode again;
2. ``cache``: a node whose 40 MiB output ComfyUI caches, ``--prompts`` times (the kept output cache grows);
3. ``leak``: a node that leaks 64 MiB per prompt into a module list, ``--prompts`` times (from the second
   prompt on the ledger suspects a leak: it collects garbage, takes a tensor census and names the owners).

For each phase: the ledger's own time per prompt (`JobRecord.overhead_s`, wall, and `overhead_cpu_s`, CPU of the
prompt worker thread: both readings, and at a suspected leak the collection, census and owner search),
against the prompt's wall time from ComfyUI's
`execution_start` to its last status message. Timings are from one run on the machine it prints.

Run:  .venv/bin/python bench/ledger_overhead.py [--prompts 6]

Writes bench/results/ledger_overhead.json (`--out`): table `phases` (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixtures"))

from comfy_harness.server import (  # noqa: E402
    HARNESS,
    comfyui_server,
    http_get,
    prepare_base,
    submit,
    write_tiny_vae_weights,
)
from comfy_harness.vendored import use_prepared_comfyui, why_unavailable  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/comfy/prompt_ledger.py", "h3director/core/ledger.py", "h3director/core/tensor_owners.py")


def decode_workflow(i: int) -> dict:
    return {
        "1": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": 22}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_audio.safetensors"}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "audio_vae": ["3", 0], "output": "video_file",
            "filename_prefix": "bench/ledger", "fps": 24.0 + i, "crf": 18}},
    }


def cache_workflow(i: int) -> dict:
    return {"1": {"class_type": "H3TestBigOutput", "inputs": {"seed": i, "mib": 40}},
            "2": {"class_type": "H3TestBlobSink", "inputs": {"blob": ["1", 0]}}}


def leak_workflow(i: int) -> dict:
    return {"1": {"class_type": "H3TestLeak", "inputs": {"seed": i, "mib": 64}}}


def prompt_seconds(entry: dict) -> float:
    stamps = {event: data.get("timestamp") for event, data in entry["status"]["messages"]}
    end = max(v for v in stamps.values() if v is not None)
    return (end - stamps["execution_start"]) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="prompts per phase (>= 3)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ledger_overhead.json")
    args = parser.parse_args()
    if args.prompts < 3:
        parser.error("--prompts must be at least 3")
    use_prepared_comfyui()
    if not os.environ.get("COMFYUI_DIR"):
        sys.exit(why_unavailable())
    with tempfile.TemporaryDirectory(prefix="h3-ledger-bench-") as folder:
        base = prepare_base(Path(folder), ["models/vae"], {"h3director_test_nodes": HARNESS / "real_node",
                                                          "h3director_ledger_test_nodes": HARNESS / "ledger_real_node"})
        (base / "custom_nodes" / "h3director_test_nodes" / "real_comfy.py").write_bytes(
            (HARNESS / "real_comfy.py").read_bytes())
        write_tiny_vae_weights(base, base / "custom_nodes" / "h3director_test_nodes")
        rows = []
        with comfyui_server(base, extra_args=["--cache-lru", "64"]) as comfy:
            for phase, workflow in (("decode", decode_workflow), ("cache", cache_workflow), ("leak", leak_workflow)):
                walls = []
                for i in range(args.prompts):
                    entry = submit(comfy, workflow(i))
                    if entry["status"]["status_str"] != "success":
                        sys.exit(f"{phase} prompt {i} failed: {json.dumps(entry['status'])[:2000]}")
                    walls.append(prompt_seconds(entry))
                ledger = json.loads(http_get(f"{comfy['url']}/h3director/stats")[1])["ledger"]
                jobs = ledger["jobs"][-args.prompts:]
                rows.append((phase, walls, jobs, ledger["leaks"]))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    body, records = [], []
    for phase, walls, jobs, leaks in rows:
        wall = [1000 * job["overhead_s"] for job in jobs]
        cpu = [1000 * job["overhead_cpu_s"] for job in jobs]
        collected = sum(job["collected"] for job in jobs)
        keys = {job["key"] for job in jobs}
        found = [leak for leak in leaks if leak["key"] in keys]
        body.append([phase, f"{statistics.median(walls):.3f}", f"{statistics.median(wall):.1f} / {max(wall):.1f}",
                     f"{statistics.median(cpu):.1f} / {max(cpu):.1f}", f"{collected} of {len(jobs)}", len(found)])
        records.append({"phase": phase, "prompt_walls_s": walls, "ledger_wall_ms": wall, "ledger_cpu_ms": cpu,
                        "collected": collected, "leaks": len(found)})
    phases = table(["phase", "prompt wall (s), median", "ledger wall (ms) per prompt, median / max",
                    "ledger CPU (ms) per prompt, median / max", "prompts with a suspected leak (collection)",
                    "leaks reported"], body,
                   f"{args.prompts} prompts per phase in one vendored ComfyUI (`--cpu --cache-lru 64`); the ledger's "
                   "own time per prompt from its accounting (wall, and CPU of the prompt worker thread) against the "
                   f"prompt's wall time. Load average {load} when the run ended (a shared machine: the wall times "
                   "include waits for a core).")
    print(f"Machine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"--prompts {args.prompts}\n")
    print(table_markdown(phases))
    write_results(args.out, "ledger_overhead", {"prompts": args.prompts},
                  {"phases": records, "load_average": load, "tables": {"phases": phases}}, sources=SOURCES)


if __name__ == "__main__":
    main()
