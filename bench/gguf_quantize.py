"""GGUF encoding: speed and error per type on one H3-sized matrix, and what Q4_K_M's mix costs at H3's widths.

    .venv/bin/python bench/gguf_quantize.py [--shape 2048 5376] [--repeats 3] [--types Q8_0 Q6_K ...]

1. encode: a float32 [rows, cols] matrix (default 2048 x 5376: 2048 rows of H3's hidden width) of two kinds of
   values, normal (sigma 0.02) and heavy-tailed (Student t, 3 degrees of freedom, scaled to sigma 0.02), encoded
   with what `weights convert` uses for each type (`weights.kquant` for Q6_K/Q5_K/Q4_K, `gguf.quants.quantize`
   for the others): median encode time of --repeats runs after a warm-up, the error of the decoded values
   (`gguf.quants.dequantize`) against the input (RMS relative to the input's RMS, largest absolute error
   relative to the largest input), and for the K-quants the largest error as a fraction of the per-sub-block
   bound the encoder guarantees (half the stored step, see `weights/kquant.py`; <= 1 is required). Each
   encoding is also decoded by `weights.dequant.dequantize_tensor` (the native core) and checked bit for bit
   against gguf's decoder.
2. sizes: bytes of the 50 blocks' four big matrices at the released widths (qkv 21504 x 5376, out 5376 x 7168,
   fc1 28672 x 5376, fc2 5376 x 14336) per type, with convert's Q4_K_M rule (`convert.mix_type`).

Ratios are the result; absolute times are this machine's.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _results import table, table_markdown, write_results  # noqa: E402
from _timing import median_seconds  # noqa: E402

from h3director import native  # noqa: E402
from h3director.weights import kquant  # noqa: E402
from h3director.weights.convert import MIXES, mix_type  # noqa: E402
from h3director.weights.dequant import dequantize_tensor  # noqa: E402

RELEASED_BLOCK = {"attn.qkv_proj.weight": (21504, 5376), "attn.out_proj.weight": (5376, 7168),
                  "mlp.fc1.weight": (28672, 5376), "mlp.fc2.weight": (5376, 14336)}
RELEASED_BLOCKS = 50
GiB = 1 << 30


def encoder(name: str):
    import gguf

    if name in kquant.ENCODERS:
        return lambda values: kquant.quantize(values, name)
    return lambda values: gguf.quants.quantize(values, gguf.GGMLQuantizationType[name])


def bound_fraction(x: np.ndarray, decoded: np.ndarray, raw: np.ndarray, name: str) -> float:
    """Largest |error| / (half the stored step) over all sub-blocks, the steps read from the block bytes."""
    n = raw.size // kquant.BLOCK_BYTES[name]
    b = raw.reshape(n, -1)
    if name == "Q6_K":
        d = b[:, 208:210].copy().view(np.float16).astype(np.float32)
        step = d * b[:, 192:208].view(np.int8).astype(np.float32)          # (n, 16)
        sub = 16
    else:
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        s = b[:, 4:16]
        sc = np.concatenate([s[:, 0:4] & 0x3F, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 2) & 0x30)], axis=1)
        step = d * sc.astype(np.float32)                                     # (n, 8)
        sub = 32
    error = np.abs(decoded.reshape(n, -1, sub).astype(np.float64) - x.reshape(n, -1, sub))
    half = step[:, :, None].astype(np.float64) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(half > 0, error / half, np.where(error > 0, np.inf, 0))
    return float(ratio.max())


def bench_encode(args) -> dict:
    import gguf

    rows, cols = args.shape
    rng = np.random.default_rng(0)
    data = {"normal": (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)}
    t = rng.standard_t(3, (rows, cols))
    data["heavy-tailed"] = (t / t.std() * 0.02).astype(np.float32)
    cells = []
    for kind, x in data.items():
        rms_x, max_x = float(np.sqrt(np.mean(x.astype(np.float64) ** 2))), float(np.abs(x).max())
        for name in args.types:
            encode = encoder(name)
            seconds = median_seconds(lambda encode=encode, x=x: encode(x), args.repeats)
            raw = encode(x)
            qtype = gguf.GGMLQuantizationType[name]
            decoded = gguf.quants.dequantize(raw, qtype)
            ours = dequantize_tensor(raw.reshape(-1), name, (rows, cols))
            same = torch.equal(ours.view(torch.int32), torch.from_numpy(decoded).view(torch.int32))
            error = decoded.astype(np.float64) - x
            bits = raw.size * 8 / x.size
            bound = f"{bound_fraction(x, decoded, raw, name):.3f}" if name in kquant.ENCODERS else "-"
            cells.append([kind, name, f"{bits:.4g}", f"{seconds:.3f}", f"{x.size / seconds / 1e6:.1f}",
                          f"{np.sqrt(np.mean(error ** 2)) / rms_x:.4f}", f"{np.abs(error).max() / max_x:.4f}", bound,
                          "yes" if same else "NO"])
    return table(["values", "type", "bits/weight", "encode (s)", "M values/s", "RMS error / RMS", "max error / max",
                  "max error / bound", "decoders' bits equal"], cells,
                 note=f"Encode one [{rows}, {cols}] float32 matrix per type; median of {args.repeats} encodes after a "
                      f"warm-up (one thread of this machine; compare the rows with each other); native decoder "
                      f"backend: {native.backend()}. Errors: gguf's decode against the input; max error / bound: the "
                      "largest error over half the stored step of its sub-block (<= 1 required).")


def bench_sizes() -> dict:
    import gguf

    def nbytes(name: str, shape: tuple[int, int]) -> int:
        values, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        return shape[0] * shape[1] // values * size

    counts = {"blocks.": RELEASED_BLOCKS, "token_refiner.blocks.": 0}
    params = RELEASED_BLOCKS * sum(r * c for r, c in RELEASED_BLOCK.values())
    cells = [["BF16", f"{params * 2 / GiB:.2f}", "16", "0"]]
    for name in ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_K_M"):
        total, upgraded = 0, 0
        for i in range(RELEASED_BLOCKS):
            for role, shape in RELEASED_BLOCK.items():
                kind = mix_type(f"blocks.{i}.{role}", *MIXES[name], counts) if name in MIXES else name
                total += nbytes(kind, shape)
                upgraded += kind == "Q6_K"
        cells.append([name, f"{total / GiB:.2f}", f"{total * 8 / params:.3f}", upgraded])
    return table(["type", "GiB", "bits/weight", "matrices in Q6_K"], cells,
                 note=f"Bytes of the four big matrices of {RELEASED_BLOCKS} blocks at the released widths (no AdaLN, "
                      "refiner or heads), with convert's Q4_K_M rule (`convert.mix_type`); arithmetic, no timing.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", type=int, nargs=2, default=(2048, 5376))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--types", nargs="+", default=["Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q4_K", "Q4_0"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gguf_quantize.json")
    args = parser.parse_args()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{platform.processor() or 'cpu'}, numpy {np.__version__}, torch threads {torch.get_num_threads()}")
    tables = {"encode": bench_encode(args), "sizes": bench_sizes()}
    for found in tables.values():
        print(table_markdown(found) + "\n")
    write_results(args.out, "gguf_quantize", {"shape": list(args.shape), "repeats": args.repeats, "types": args.types},
                  {"tables": tables}, sources=("h3director/weights/kquant.py", "h3director/weights/convert.py",
                                               "h3director/weights/dequant.py"))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
