"""Bytes that N consumers of one shared conditioning hold: read-only views (what Shared Read and Cached Text Encode
hand out) vs a clone per consumer (what they handed out before).

    COMFYUI_DIR=.comfy/ComfyUI .venv/bin/python bench/shared_read_copies.py [--consumers 1 2 4] \
        [--tokens 512] [--width 5120] [--dtype bfloat16]

Each (mode, consumers) runs in its own subprocess with ComfyUI's `comfy_api` importable (the node module
imports it; COMFYUI_DIR, default the vendored `.comfy/ComfyUI`). Under `torch.inference_mode` (as ComfyUI runs
nodes) it makes a conditioning like a text encoder's (``[[embeddings [1, tokens, width], {"pooled_output":
[1, width]}]]``), stores it with `h3director.comfy.nodes_shared.put_conditioning` into a `SharedTensorStore` and
drops the producer's tensors, then has N consumers read it with `get_conditioning(..., reader=...)`:

- views: what the nodes return now, the store's tensors shared;
- clones: the same reads, each tensor then cloned (``tensor.clone()``, the nodes' former last step).

Recorded per run: the bytes of distinct tensor storages (by `untyped_storage().data_ptr()`) held by the store
and the consumers together, of those the consumers hold beyond the store's, and the growth of the process's
resident set from after the put to after the reads (`h3director.core.devices.process_rss_bytes`). Writes
bench/results/shared_read_copies.json (`--out`) with `bench/_results.py:write_results`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402

CHILD = """
import json, sys
import torch
from h3director.comfy.nodes_shared import flatten, get_conditioning, put_conditioning, unflatten
from h3director.core.devices import process_rss_bytes
from h3director.core.shared_store import SharedTensorStore

mode, consumers, tokens, width, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dtype = getattr(torch, dtype)
store = SharedTensorStore()
with torch.inference_mode():
    produced = [[torch.randn(1, tokens, width, dtype=dtype), {"pooled_output": torch.randn(1, width, dtype=dtype)}]]
    put_conditioning(store, "prompt", produced, "writer", False)
    del produced
    before = process_rss_bytes()
    held = []
    for index in range(consumers):
        read = get_conditioning(store, "prompt", reader=f"consumer-{index}")
        if mode == "clones":
            tensors = []
            skeleton = flatten(read, tensors)
            read = unflatten(skeleton, [t.clone() for t in tensors])
        held.append(read)
    after = process_rss_bytes()

def storages(tensors):
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}

stored = storages([store.get(k) for k in store.keys() if not k.endswith("skeleton")])
consumed = []
for read in held:
    flatten(read, consumed)
consumed = storages(consumed)
everything = {**stored, **consumed}
print(json.dumps({"copy_bytes": sum(stored.values()), "held_bytes": sum(everything.values()),
                  "consumer_own_bytes": sum(v for k, v in consumed.items() if k not in stored),
                  "distinct_storages": len(everything), "rss_growth_bytes": after - before}))
"""


def run(mode: str, consumers: int, args: argparse.Namespace, comfy_dir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), comfy_dir]))
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(consumers), str(args.tokens), str(args.width),
                          args.dtype], capture_output=True, text=True, env=env, cwd=str(REPO))
    if out.returncode != 0:
        raise SystemExit(f"{mode} x{consumers} failed:\n{out.stderr[-4000:]}")
    return {"mode": mode, "consumers": consumers, **json.loads(out.stdout.strip().splitlines()[-1])}


def markdown(rows: list[dict], arguments: dict) -> str:
    """The results as a Markdown table (MiB), headed by the conditioning's shape."""
    lines = [f"Conditioning `[1, {arguments['tokens']}, {arguments['width']}]` + pooled `[1, {arguments['width']}]`, "
             f"{arguments['dtype']}.", "",
             "| consumers | mode | bytes held (store + consumers) | consumers' own bytes | RSS growth on reads |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['consumers']} | {row['mode']} | {row['held_bytes'] / 2**20:.2f} MiB | "
                     f"{row['consumer_own_bytes'] / 2**20:.2f} MiB | {row['rss_growth_bytes'] / 2**20:.2f} MiB |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=512, help="text tokens of the conditioning")
    parser.add_argument("--width", type=int, default=5120, help="embedding width (H3's text encoder: 5120)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", default=str(REPO / "bench/results/shared_read_copies.json"))
    args = parser.parse_args()
    comfy_dir = os.environ.get("COMFYUI_DIR") or str(REPO / ".comfy/ComfyUI")
    if not Path(comfy_dir, "comfy_api").is_dir():
        raise SystemExit(f"COMFYUI_DIR {comfy_dir!r} is not a ComfyUI checkout (run scripts/setup_comfyui.sh)")
    rows = [run(mode, n, args, comfy_dir) for n in args.consumers for mode in ("clones", "views")]
    print(markdown(rows, vars(args)))
    path = write_results(args.out, "shared_read_copies",
                         {"consumers": args.consumers, "tokens": args.tokens, "width": args.width,
                          "dtype": args.dtype}, {"rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
