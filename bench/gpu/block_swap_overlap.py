"""Transfer/compute overlap of the block swap on one CUDA GPU: ComfyUI node path and diffusers call, side by side.

    python bench/gpu/block_swap_overlap.py --out results.json [--offload 6] [--layers 12] [--repeats 3]
    python bench/gpu/block_swap_overlap.py --dry-run --out dry.json     # CPU, toy sizes: the plumbing only

For each path (ComfyUI's own `MiniMaxH3Model` through `h3director.integrations.comfy_blockswap.install`, the
node's call; diffusers' `MiniMaxH3Transformer3DModel` through
`h3director.integrations.diffusers_offload.apply_block_offload`), at a modest size (default: 12 blocks, hidden
3072, 24 x 128 heads, FFN 8192, bf16; 768x768 x 124 frames: 21,312 video + 414 audio + 256 text = 21,982 packed rows), one DiT forward is timed
(median of --repeats after one warm-up, `torch.cuda.synchronize` around it; for ComfyUI the sampler's model load
before each forward, with the swap's offload after it, runs outside the clock) in three settings:

- resident: every block on the GPU;
- stream: --offload blocks in pinned host RAM, each copied in on the side stream while the block before runs;
- sync: the same blocks copied in on the compute stream when their turn comes (`use_stream=False`).

Derived, per path: transfer_s = sync - resident (the copies' cost when nothing hides them), hidden_s =
sync - stream (what the side stream hid), overlap = hidden_s / transfer_s (1.0: fully hidden), and the copy
bandwidth measured alone (pinned host -> device, one block's bytes, CUDA events). Also: `torch.equal` of each
offloaded output to the resident one, bytes allocated at the start of the forward and the peak (CUDA),
ComfyUI's `loaded_size()` (its weight accounting, lowered by the offloaded blocks), the swap's own counts
(onloads, prefetched, peak offloaded blocks on the device).

Writes one JSON to --out (with the torch/CUDA versions, the GPU name and the code's git revision). Without a GPU
and without --dry-run it says so and exits 2. Meant to finish in well under a minute on an H200.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

FULL = {"layers": 12, "hidden": 3072, "heads": 24, "head_dim": 128, "ffn": 8192, "text_dim": 3072, "t_dim": 1536,
        "width": 768, "height": 768, "frames": 124, "text_tokens": 256, "rope": 16}
DRY = {"layers": 4, "hidden": 64, "heads": 4, "head_dim": 16, "ffn": 96, "text_dim": 64, "t_dim": 32,
       "width": 64, "height": 64, "frames": 22, "text_tokens": 8, "rope": 2}


def git_revision() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return "unknown"


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, prepare=None) -> tuple[float, object, dict]:
    """Median seconds of `fn(prepared)` over `repeats` runs after one warm-up; the last output; memory stats
    (CUDA: allocated at the start, peak). `prepare()` (ComfyUI's load) runs before each, outside the clock."""
    import torch

    out = fn(prepare() if prepare else None)
    sync(device)
    seconds = []
    memory = {}
    for _ in range(repeats):
        gc.collect()
        prepared = prepare() if prepare else None
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            start = torch.cuda.memory_allocated(device)
        began = time.perf_counter()
        out = fn(prepared)
        sync(device)
        seconds.append(time.perf_counter() - began)
        if device.type == "cuda":
            memory = {"allocated_at_start_bytes": start,
                      "peak_allocated_bytes": torch.cuda.max_memory_allocated(device)}
    return statistics.median(seconds), out, memory


def copy_bandwidth(nbytes: int, device) -> dict:
    """Pinned host -> device copy of `nbytes` alone (CUDA events, median of 5)."""
    import torch

    if device.type != "cuda":
        return {"bytes": nbytes, "note": "no CUDA device"}
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    seconds = statistics.median(times[1:])
    return {"bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}


def equal(a, b) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def derived(resident: float, stream: float, blocking: float) -> dict:
    transfer = blocking - resident
    hidden = blocking - stream
    return {"transfer_s": transfer, "hidden_s": hidden,
            "overlap": (hidden / transfer) if transfer > 0 else None,
            "stream_over_resident": stream / resident, "sync_over_resident": blocking / resident}


# ------------------------------------------------------------------------------------------------- ComfyUI

def comfy_path(size: dict, offload: int, repeats: int, device, dtype, dry: bool) -> dict:
    import dit_12gb

    from h3director.integrations import comfy_blockswap

    comfy = dit_12gb.import_comfy(cpu=device.type == "cpu", smoke=dry)
    config = {"hidden_size": size["hidden"], "num_layers": size["layers"], "token_refiner_num_layers": 1,
              "num_attention_heads": size["heads"], "attention_head_dim": size["head_dim"],
              "ffn_hidden_size": size["ffn"], "text_dim": size["text_dim"], "time_embed_hidden_size": size["hidden"],
              "time_embed_dim": size["t_dim"], "rope_inv_freq_len": size["rope"]}
    patcher = dit_12gb.build_patcher(comfy, config, device, dtype, seed=0)
    inputs = dit_12gb.make_inputs(config, size["width"], size["height"], size["frames"], size["text_tokens"],
                                  0.6, device, dtype, seed=0)
    block_bytes = dit_12gb.block_weight_bytes(patcher)

    def forward(model):
        """One DiT forward as the sampler calls it; the options come from `prepare` (ComfyUI's load, with the
        swap's ON_LOAD offload, outside the clock); the swap's per-forward work is inside it."""
        def fn(options):
            import torch

            with torch.inference_mode():
                out = model.model.diffusion_model(inputs["x"], inputs["timestep"], inputs["context"],
                                                  transformer_options=options,
                                                  minimax_payload={"audio_scale": 1.0, "seed": 0})
            return [t.detach() for t in out]
        return fn

    def load(model):
        return lambda: dit_12gb.sampler_options(comfy, model)

    result = {"config": config, "geometry": inputs["geometry"], "block_bytes": block_bytes}
    t_res, ref, mem = timed(forward(patcher), device, repeats, load(patcher))
    result["resident"] = {"seconds": t_res, "comfy_loaded_size_bytes": int(patcher.loaded_size()), **mem}
    for name, stream in (("stream", True), ("sync", False)):
        model, handle = comfy_blockswap.install(patcher, offload, use_stream=stream)
        t, out, mem = timed(forward(model), device, repeats, load(model))
        result[name] = {"seconds": t, "equal_to_resident": equal(ref, out), "report": handle.last_report,
                        "comfy_loaded_size_bytes": int(model.loaded_size()), **mem}
        handle.on_detach(model, False)  # as ComfyUI's detach: the next load places the blocks again
        del model, handle
    result.update(derived(t_res, result["stream"]["seconds"], result["sync"]["seconds"]))
    result["copy_one_block"] = copy_bandwidth(block_bytes, device)
    del patcher
    return result


# ------------------------------------------------------------------------------------------------ diffusers

def diffusers_inputs(model, size: dict, device, dtype) -> dict:
    """A packed sequence laid out as the diffusers H3 pipeline does (text, audio, video rows)."""
    import torch

    from h3director import geometry

    cfg = model.config
    frames = geometry.latent_frames_for(size["frames"])
    gh, gw = size["height"] // 32, size["width"] // 32
    audio = geometry.audio_latent_frames_for(size["frames"])
    text, audio_rows, video_rows = size["text_tokens"], 2 * audio, frames * gh * gw
    rows = text + audio_rows + video_rows
    pos = torch.zeros(rows, 3, dtype=torch.float64)
    pos[:text, 0] = torch.arange(text, dtype=torch.float64)
    pos[text:text + audio_rows, 0] = (text + torch.arange(audio, dtype=torch.float64)).repeat(2)
    grid = torch.stack(torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                                      indexing="ij"), -1).reshape(-1, 2)
    pos[text + audio_rows:, 0] = (text + torch.arange(frames, dtype=torch.float64)).repeat_interleave(gh * gw)
    pos[text + audio_rows:, 1:] = grid.repeat(frames, 1)
    tags = torch.zeros(rows, dtype=torch.long)
    tags[:text] = 1
    tags[text:text + audio_rows] = 2
    g = torch.Generator().manual_seed(1)
    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    on = {"device": device}
    return dict(hidden_states=torch.randn(1, video_rows, patch, generator=g).to(dtype).to(**on),
                audio_hidden_states=torch.randn(1, audio_rows, cfg.audio_in_channels, generator=g).to(dtype).to(**on),
                encoder_hidden_states=torch.randn(1, text, cfg.text_dim, generator=g).to(dtype).to(**on),
                timestep=torch.tensor([0.6], **on), timestep_indices=torch.zeros(rows, dtype=torch.long, **on),
                token_tags=tags.to(**on), position_ids=pos.to(**on),
                video_indices=torch.arange(text + audio_rows, rows, **on),
                audio_indices=torch.arange(text, text + audio_rows, **on), text_indices=torch.arange(text, **on))


def diffusers_path(size: dict, offload: int, repeats: int, device, dtype) -> dict:
    import torch
    from diffusers import MiniMaxH3Transformer3DModel

    from h3director.integrations.diffusers_offload import apply_block_offload

    torch.manual_seed(0)
    with torch.device(device):
        model = MiniMaxH3Transformer3DModel(
            num_attention_heads=size["heads"], attention_head_dim=size["head_dim"], hidden_size=size["hidden"],
            num_layers=size["layers"], num_refiner_layers=1, ffn_dim=size["ffn"], text_dim=size["text_dim"],
            time_embed_hidden_dim=size["hidden"], time_embed_dim=size["t_dim"], rope_freq_dim=size["rope"]).eval()
    keep = model._keep_in_fp32_modules
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not any(part in name for part in keep):
            tensor.data = tensor.data.to(dtype)
    inputs = diffusers_inputs(model, size, device, dtype)
    block_bytes = sum(p.numel() * p.element_size() for p in model.transformer_blocks[0].parameters())

    def run(_prepared=None):
        with torch.no_grad():
            out = model(**inputs)
        return out.sample, out.audio_sample

    result = {"block_bytes": block_bytes, "packed_rows": int(inputs["position_ids"].shape[0])}
    t_res, ref, mem = timed(run, device, repeats)
    result["resident"] = {"seconds": t_res, **mem}
    for name, stream in (("stream", True), ("sync", False)):
        handle = apply_block_offload(model, offload, onload_device=device, use_stream=stream)
        try:
            t, out, mem = timed(run, device, repeats)
            stats = handle.stats
            result[name] = {"seconds": t, "equal_to_resident": equal(ref, out), "offloaded": list(handle.offloaded),
                            "onloads": stats.onloads, "prefetched": stats.prefetched,
                            "peak_offloaded_on_device": stats.peak_offloaded_on_device, **mem}
        finally:
            handle.remove()
    result.update(derived(t_res, result["stream"]["seconds"], result["sync"]["seconds"]))
    result["copy_one_block"] = copy_bandwidth(block_bytes, device)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="results JSON path")
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes: check the plumbing, no timing claims")
    parser.add_argument("--offload", type=int, default=None, help="blocks offloaded (default: half the blocks)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default="comfy,diffusers", help="comma list of: comfy, diffusers")
    args = parser.parse_args(argv)

    import torch

    size = dict(DRY if args.dry_run else FULL)
    if args.layers is not None:
        size["layers"] = args.layers
    offload = size["layers"] // 2 if args.offload is None else args.offload
    if not 0 <= offload <= size["layers"]:
        print(f"block_swap_overlap: --offload must be 0..{size['layers']}, got {offload}", file=sys.stderr)
        return 2
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if set(paths) - {"comfy", "diffusers"}:
        print(f"block_swap_overlap: unknown path in --paths {args.paths!r}", file=sys.stderr)
        return 2
    if args.dry_run:
        device, dtype = torch.device("cpu"), torch.float32
    elif not torch.cuda.is_available():
        print("block_swap_overlap: needs a CUDA GPU (use --dry-run to check the plumbing on a CPU)", file=sys.stderr)
        return 2
    else:
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16

    result = {"argv": sys.argv[1:] if argv is None else argv, "dry_run": args.dry_run, "device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
              "git": git_revision(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "dtype": str(dtype).replace("torch.", ""), "size": size, "offload": offload, "repeats": args.repeats}
    if "diffusers" in paths:  # before ComfyUI: its stand-ins for absent torchvision/torchaudio (--dry-run) confuse diffusers
        import diffusers.models.transformers.transformer_minimax_h3  # noqa: F401
    began = time.perf_counter()
    if "comfy" in paths:
        result["comfy"] = comfy_path(size, offload, args.repeats, device, dtype, args.dry_run)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "diffusers" in paths:
        result["diffusers"] = diffusers_path(size, offload, args.repeats, device, dtype)
    result["wall_s"] = time.perf_counter() - began
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    for path in paths:
        r = result[path]
        overlap = r["overlap"]
        print(f"{path:9s} resident {r['resident']['seconds']:.4f} s, stream {r['stream']['seconds']:.4f} s, "
              f"sync {r['sync']['seconds']:.4f} s, overlap {'n/a' if overlap is None else f'{overlap:.2f}'}, "
              f"equal {r['stream']['equal_to_resident'] and r['sync']['equal_to_resident']}")
    print(f"wrote {args.out} ({result['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
