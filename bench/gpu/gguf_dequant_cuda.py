"""The CUDA dequantisation path (`weights.dequant` -> `dequant_torch` on the device): bits and speed.

    python bench/gpu/gguf_dequant_cuda.py [--types Q4_K Q8_0 Q6_K Q5_K Q4_0 Q4_1 Q5_0 Q5_1] [--shape 28672 5376]
        [--repeats 10] [--out results.json] [--smoke]

For each type: random blocks with ordinary float16 scales plus one block of every extreme scale (inf, NaN,
subnormal, largest) at one H3 layer's shape; the raw bytes are copied host -> device and decoded there by
`dequantize_tensor(..., device="cuda")`; the float32 result is compared bit for bit (NaN positions) with
`gguf.quants.dequantize` on the CPU, and the bfloat16 result with torch's CPU cast of the reference.
Times (CUDA events, median of --repeats): the decode alone, the host -> device copy of the quantised bytes,
and for comparison the copy of the same layer as bf16 (what crosses the bus without quantisation).
Without a GPU it exits 2; --smoke runs the same steps at a small shape on the CPU to check the plumbing.
JSON goes to --out, else $OUT/gguf_dequant_cuda.json, else ./gguf_dequant_cuda.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _gguf_blocks import random_blocks  # noqa: E402
from _timing import median_cuda_seconds, median_seconds  # noqa: E402

from h3director.weights import dequant_torch  # noqa: E402
from h3director.weights.dequant import dequantize_tensor  # noqa: E402

EXTREMES = [0x7C00, 0xFC00, 0x7E00, 0x0001, 0x7BFF, 0x0400]


def _timed(fn, repeats, device):
    return median_cuda_seconds(fn, repeats) if device.type == "cuda" else median_seconds(fn, repeats)


def main() -> int:
    import gguf
    from gguf import quants

    p = argparse.ArgumentParser()
    p.add_argument("--types", nargs="+", default=["Q4_K", "Q8_0", "Q6_K", "Q5_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
    p.add_argument("--shape", nargs=2, type=int, default=[28672, 5376])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        device, (rows, cols), args.repeats = torch.device("cpu"), (64, 512), 2
    elif not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure (use --smoke to check the plumbing on the CPU)", file=sys.stderr)
        return 2
    else:
        device, (rows, cols) = torch.device("cuda"), args.shape
    rng = np.random.default_rng(0)
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
               "torch": torch.__version__, "shape": [rows, cols], "types": {}}
    bf16_host = torch.empty((rows, cols), dtype=torch.bfloat16).pin_memory() if device.type == "cuda" else None
    for name in args.types:
        raw = random_blocks(name, rows * cols, rng, EXTREMES)
        qtype = gguf.GGMLQuantizationType[name]
        with np.errstate(all="ignore"):
            ref = quants.dequantize(raw.reshape(rows, -1), qtype)
        got = dequantize_tensor(raw, qtype, (rows, cols), device=device).cpu().numpy()
        nan = np.isnan(ref)
        f32_equal = bool(np.array_equal(np.isnan(got), nan) and
                         np.array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan]))
        got_bf = dequantize_tensor(raw, qtype, (rows, cols), dtype=torch.bfloat16, device=device).cpu()
        ref_bf = torch.from_numpy(ref).to(torch.bfloat16)
        bnan = torch.isnan(ref_bf)
        bf_equal = bool(torch.equal(torch.isnan(got_bf), bnan) and torch.equal(got_bf[~bnan], ref_bf[~bnan]))
        raw_t = torch.from_numpy(raw)
        if device.type == "cuda":
            raw_t = raw_t.pin_memory()
        on_device = raw_t.to(device)
        decode = _timed(partial(dequant_torch.dequantize_blocks, on_device, name, torch.bfloat16), args.repeats, device)
        copy_q = _timed(partial(raw_t.to, device, non_blocking=True), args.repeats, device)
        copy_bf = None if bf16_host is None else _timed(partial(bf16_host.to, device, non_blocking=True), args.repeats,
                                                        device)
        results["types"][name] = {"float32_bits_equal": f32_equal, "bf16_bits_equal": bf_equal, "decode_s": decode,
                                  "copy_quantised_s": copy_q, "copy_bf16_s": copy_bf, "quantised_bytes": raw.size}
        print(name, results["types"][name], flush=True)
    out = Path(args.out or (Path(os.environ["OUT"]) / "gguf_dequant_cuda.json" if os.environ.get("OUT")
                            else "gguf_dequant_cuda.json"))
    out.write_text(json.dumps(results, indent=2))
    ok = all(r["float32_bits_equal"] and r["bf16_bits_equal"] for r in results["types"].values())
    print(f"wrote {out}; all bits equal: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
