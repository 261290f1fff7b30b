"""The memory ledger on a CUDA device: a device leak is found, device memory kept on purpose is not.

    python bench/gpu/ledger_cuda.py [--leak-mib 64] [--jobs 6] [--out results.json] [--smoke]

A loop of jobs on ``cuda:0`` under `MemoryLedger(devices=("cpu", "cuda:0"))`, in two scenarios:

- ``leak``: each job runs a small model (kept on purpose: its weights are declared in ``KeptMemory``) and
  appends ``--leak-mib`` MiB of new device tensors to a module-level list;
- ``cache``: each job stores a new ``--leak-mib`` MiB device tensor in a dict declared as kept on purpose.

Checks (the run exits 1 when one fails): ``leak`` reports a ``cuda:0`` leak by its third job, growth per job
within 10% of ``--leak-mib``, the largest suspect on ``cuda:0`` held by ``LEAKED``; ``cache`` reports no leak,
while its kept bytes on ``cuda:0`` grow by ``--leak-mib`` per job. Recorded: every job's allocated and reserved
bytes (reserved is an estimate under cudaMallocAsync, flagged), its growth per series and the ledger's own
seconds. Without a GPU it exits 2; ``--smoke`` runs the same on the CPU (the ``host`` series) to check the
plumbing, with glibc's mmap threshold pinned at 1 MiB (`h3director.core.host_heap`), so that freed scratch
buffers of the model's forward leave the RSS instead of creeping it up by a few MiB per job. JSON goes to --out, else $OUT/ledger_cuda.json, else ./ledger_cuda.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from h3director.core.devices import cuda_allocator_backend
from h3director.core.host_heap import pin_mmap_threshold
from h3director.core.ledger import HOST, KeptMemory, LeakRule, MemoryLedger

MiB = 1024 * 1024
LEAKED: list[torch.Tensor] = []


def scenario(name: str, device: str, leak_mib: int, jobs: int) -> dict:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(device)
    cache: dict[int, torch.Tensor] = {}
    series = HOST if device == "cpu" else device
    ledger = MemoryLedger(devices=("cpu", device) if device != "cpu" else ("cpu",),
                          rule=LeakRule(jobs=3, min_growth_bytes=16 * MiB),
                          kept=lambda: KeptMemory({"model": [model], "cache": [cache]}))
    found_at = None
    for i in range(jobs):
        with ledger.job(name, label=f"job {i}"), torch.no_grad():
            model(torch.randn(256, 1024, device=device))
            block = torch.ones(leak_mib * MiB, dtype=torch.uint8, device=device)
            if name == "leak":
                LEAKED.append(block)
            else:
                cache[i] = block
            del block
        if found_at is None and any(leak.series == series for leak in ledger.leaks):
            found_at = i
    leaks = [leak.to_dict() for leak in ledger.leaks if leak.series == series]
    return {"scenario": name, "device": device, "found_at_job": found_at, "leaks": leaks,
            "jobs": [{"steps": r.steps, "end_devices": r.end.devices, "kept_bytes": r.end.kept_bytes,
                      "overhead_s": r.overhead_s} for r in ledger.records]}


def check(results: dict, leak_mib: int) -> list[str]:
    problems = []
    leak, cache = results["leak"], results["cache"]
    device = "cpu" if leak["device"] == "cpu" else leak["device"]
    if leak["found_at_job"] is None or leak["found_at_job"] > 2:
        problems.append(f"leak: not reported by the third job (found at {leak['found_at_job']})")
    elif abs(leak["leaks"][0]["growth_per_job_bytes"] - leak_mib * MiB) > 0.1 * leak_mib * MiB:
        problems.append(f"leak: growth {leak['leaks'][0]['growth_per_job_bytes']} not within 10% of {leak_mib} MiB")
    elif not leak["leaks"][0]["suspects"] or leak["leaks"][0]["suspects"][0]["device"] != device \
            or "LEAKED[" not in leak["leaks"][0]["suspects"][0]["owner"]:
        problems.append(f"leak: largest suspect not LEAKED on {device}: {leak['leaks'][0]['suspects'][:1]}")
    if cache["leaks"]:
        problems.append(f"cache: reported as a leak: {cache['leaks']}")
    kept = [job["kept_bytes"].get(device, 0) for job in cache["jobs"]]
    if kept[-1] - kept[0] < (len(kept) - 1) * leak_mib * MiB:
        problems.append(f"cache: kept bytes on {device} did not grow by {leak_mib} MiB a job: {kept}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leak-mib", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="run on the CPU (plumbing check, no device numbers)")
    args = parser.parse_args()
    if args.jobs < 3 or args.leak_mib < 17:
        parser.error("--jobs must be >= 3 and --leak-mib >= 17 (above the 16 MiB floor)")
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or --smoke on the CPU", file=sys.stderr)
        sys.exit(2)
    device = "cpu" if args.smoke else "cuda:0"
    if args.smoke:
        pin_mmap_threshold(1 * MiB)
    results = {"torch": torch.__version__, "device": device,
               "allocator": None if args.smoke else cuda_allocator_backend(),
               "leak": scenario("leak", device, args.leak_mib, args.jobs),
               "cache": scenario("cache", device, args.leak_mib, args.jobs)}
    results["problems"] = check(results, args.leak_mib)
    out = args.out or Path(os.environ.get("OUT", ".")) / "ledger_cuda.json"
    out.write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps({"problems": results["problems"], "found_at_job": results["leak"]["found_at_job"],
                      "growth_per_job_bytes": [leak["growth_per_job_bytes"] for leak in results["leak"]["leaks"]],
                      "out": str(out)}))
    sys.exit(1 if results["problems"] else 0)


if __name__ == "__main__":
    main()
