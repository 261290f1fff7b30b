"""H3's full DiT on one CUDA GPU under a 12 GB memory cap, with the H3Director DiT Memory node in auto mode.

    COMFYUI_DIR=/path/to/ComfyUI python bench/gpu/dit_12gb.py [--out results.json] [--card-gb 12]
        [--mode auto] [--layers 50] [--width 1344 --height 768 --frames 362] [--kernel-rows 8192]

Needs a CUDA GPU with room for the weights (61.7 GiB at bf16, 1.20 GiB per block: an 80 GB card or larger)
and ComfyUI's source tree ($COMFYUI_DIR, else .comfy/ComfyUI under the repository). Without a GPU it says
so and exits 2; `--smoke` runs the same steps at toy widths on any device (the CPU included) to check
the plumbing, without the memory cap.

Steps, each recorded in the JSON (written to --out, else $OUT/dit_12gb.json, else ./dit_12gb.json):

1. `verify_kernels` on the GPU (bf16, H3's real widths, --kernel-rows rows), filed in a kernel cache next
   to the output ($H3_KERNEL_CACHE) so the node's "exact only" mode can consult it.
2. ComfyUI's own model: `comfy.supported_models.MiniMaxH3` -> `comfy.model_base.MiniMaxH3` ->
   `comfy.ldm.minimax.model.MiniMaxH3Model` (50 blocks, hidden 5376, 56 x 128 heads, FFN 14336), weights
   created on the GPU in bf16 (`comfy.ops.disable_weight_init`: no host copy, no init pass) and filled in
   place with seeded random values, wrapped in ComfyUI's `ModelPatcher`.
3. Input: video latent for WIDTHxHEIGHT x FRAMES from `h3director.geometry` (1344x768 x 362 frames: 107
   latent frames of 48 x 84 -> 107,856 video rows), the audio latent that goes with it (603 frames x 2
   channels -> 1,206 rows) and --text-tokens rows of text states at the model's width (as the sampler
   passes them after `preprocess_text_embeds`). One denoising step = one forward of the DiT at one sigma
   (no CFG), called as ComfyUI's sampler calls it: the patcher loaded by `load_models_gpu` (object
   patches applied), `transformer_options` built by `comfy.sampler_helpers.prepare_model_patcher`.
4. Reference: the stock model, no memory cap: output, time, `max_memory_allocated` above the resident
   weights.
5. The cap: `torch.cuda.set_per_process_memory_fraction` so the caching allocator may hold what is
   resident (weights, inputs) plus --card-gb minus two blocks' weights. On a real 12 GB card the 50
   blocks' weights stream under Dynamic VRAM and the current and the prefetched block are what stays;
   here every weight stays resident (Dynamic VRAM is off) and only the rest of the card is emulated.
6. Stock under the cap (expected to run out of memory: that is the problem being solved), then the node
   (mode --mode, budget = the cap in GB unless --budget-gb) under the cap: output, time, peak, the node's
   report (tier, exactness, verified), and `torch.equal` against the reference.

Absolute times are from the GPU that ran it; compare tiers by the ratio to the reference run.
Known risk at 362 frames: the packed sequence (109,574 rows) times the fused QKV width (21,504) is over 2**31
elements, past which 32-bit offsets overflow (../shared/h3-facts.md); a kernel with 32-bit indexing fails or
misbehaves there in the stock run as well, and the JSON's `nonfinite` counts and error lines show it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
NODE_ID = "H3DirectorDiTMemory"
SMOKE_CONFIG = {"hidden_size": 256, "num_layers": 2, "token_refiner_num_layers": 1, "num_attention_heads": 2,
                "attention_head_dim": 128, "ffn_hidden_size": 512, "text_dim": 256, "time_embed_hidden_size": 256,
                "time_embed_dim": 128}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Needs a CUDA GPU (about 62 GiB free for the weights) unless --smoke.")
    parser.add_argument("--out", default=None, help="JSON output (default $OUT/dit_12gb.json or ./dit_12gb.json)")
    parser.add_argument("--card-gb", type=float, default=12.0, help="emulated card size in GiB (default 12)")
    parser.add_argument("--mode", default="auto", choices=("auto", "exact only", "fixed"), help="node mode")
    parser.add_argument("--head-chunks", type=int, default=1, help="node head_chunks (the floor in auto)")
    parser.add_argument("--ffn-chunks", type=int, default=1, help="node ffn_chunks (the floor in auto)")
    parser.add_argument("--budget-gb", type=float, default=None,
                        help="node budget_gb (default: the allocator cap the bench sets, in GiB)")
    parser.add_argument("--layers", type=int, default=50, help="DiT blocks (default 50, H3's count)")
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--frames", type=int, default=362, help="pixel frames on the 17n+5 grid")
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--sigma", type=float, default=0.9, help="video sigma of the step")
    parser.add_argument("--kernel-rows", type=int, default=8192, help="rows for verify_kernels (0: skip)")
    parser.add_argument("--skip-stock-under-cap", action="store_true",
                        help="do not run the stock model under the cap (it is expected to run out of memory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="toy widths, small canvas, 2 blocks, any device, no cap: checks the plumbing only")
    parser.add_argument("--device", default=None, help="with --smoke: the device (default cuda if present, else cpu)")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# ComfyUI


def comfy_dir() -> Path:
    path = Path(os.environ.get("COMFYUI_DIR") or REPO / ".comfy" / "ComfyUI")
    if not (path / "comfy" / "ldm" / "minimax" / "model.py").is_file():
        raise SystemExit(f"dit_12gb: no ComfyUI with the MiniMax H3 model at {str(path)!r}: set COMFYUI_DIR")
    return path


def import_comfy(cpu: bool, smoke: bool):
    """Import ComfyUI's modules with PyTorch SDPA attention (what verify_kernels checks) and Dynamic VRAM
    off (every weight stays where it was created). With --smoke on a machine without torchvision /
    torchaudio (which ComfyUI imports at module level for other models), the test harness's stand-ins
    for them are used; the full run needs ComfyUI's real environment."""
    import importlib.util

    missing = [name for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name) is None]
    if missing and smoke:
        sys.path.insert(0, str(REPO / "fixtures" / "comfy_harness"))
        from dit_worker import _UnavailableFinder

        sys.meta_path.insert(0, _UnavailableFinder(missing))
        print(f"dit_12gb --smoke: stand-ins for {missing} (not installed here)", file=sys.stderr)
    sys.path.insert(0, str(comfy_dir()))
    argv = ["main.py", "--use-pytorch-cross-attention", "--disable-dynamic-vram"] + (["--cpu"] if cpu else [])
    saved, sys.argv = sys.argv, argv
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.ldm.minimax.model  # noqa: F401
        import comfy.model_base  # noqa: F401
        import comfy.model_management  # noqa: F401
        import comfy.model_patcher  # noqa: F401
        import comfy.ops  # noqa: F401
        import comfy.patcher_extension  # noqa: F401
        import comfy.supported_models  # noqa: F401
        import comfy.utils  # noqa: F401
    finally:
        sys.argv = saved
    import comfy

    return comfy


def build_patcher(comfy, config: dict, device, dtype, seed: int):
    """ComfyUI's MiniMax H3 BaseModel with its DiT created on `device` and filled with seeded random
    values in place, inside a ModelPatcher."""
    import torch

    model_config = comfy.supported_models.MiniMaxH3({"image_model": "minimax_h3", **config})
    model_config.set_inference_dtype(dtype, None)
    model_config.custom_operations = comfy.ops.disable_weight_init  # torch.empty on the device, no init
    base = model_config.get_model({}, device=device)
    if base.diffusion_model.blocks[0].attn.qkv_proj.weight is None:  # lazily created under Dynamic VRAM
        raise SystemExit("dit_12gb: ComfyUI created the layers without weights (Dynamic VRAM is on)")
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in base.diffusion_model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, param.shape[-1] ** -0.5, generator=generator)
            elif "norm" in name.split(".")[-2]:  # RMSNorm scales near 1
                param.normal_(1.0, 0.02, generator=generator)
            else:
                param.normal_(0.0, 0.02, generator=generator)
        inv_freq = base.diffusion_model.rope.inv_freq
        n = inv_freq.numel()
        inv_freq.copy_(10000.0 ** (-torch.arange(n, dtype=torch.float32, device=inv_freq.device) / n))
    patcher = comfy.model_patcher.ModelPatcher(base, load_device=device, offload_device=device)
    return patcher


def block_weight_bytes(patcher) -> int:
    block = patcher.model.diffusion_model.blocks[0]
    return sum(p.numel() * p.element_size() for p in block.parameters())


def make_inputs(config: dict, width: int, height: int, frames: int, text_tokens: int, sigma: float,
                device, dtype, seed: int) -> dict:
    """Latents and text states as the sampler hands them to the DiT (compute dtype), with row counts."""
    import torch

    from h3director import geometry

    latent_t = geometry.latent_frames_for(frames)
    lat_h, lat_w = height // geometry.SPATIAL_RATIO, width // geometry.SPATIAL_RATIO
    audio_t = geometry.audio_latent_frames_for(frames)
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    video = torch.randn(1, geometry.VIDEO_LATENT_CHANNELS, latent_t, lat_h, lat_w, generator=generator,
                        device=device, dtype=torch.float32).to(dtype)
    audio = torch.randn(1, geometry.AUDIO_LATENT_CHANNELS, 2, audio_t, generator=generator, device=device,
                        dtype=torch.float32).to(dtype)
    hidden = config.get("hidden_size", 5376)
    context = torch.randn(1, text_tokens, hidden, generator=generator, device=device, dtype=torch.float32).to(dtype)
    timestep = torch.tensor([sigma * 1000.0], device=device, dtype=torch.float32)
    video_rows = geometry.video_tokens(width, height, frames)
    return {"x": [video, audio], "timestep": timestep, "context": context,
            "geometry": {"width": width, "height": height, "frames": frames, "latent": [latent_t, lat_h, lat_w],
                         "audio_latent_frames": audio_t, "video_rows": video_rows, "audio_rows": 2 * audio_t,
                         "text_rows": text_tokens, "packed_rows": video_rows + 2 * audio_t + text_tokens}}


def sampler_options(comfy, patcher) -> dict:
    """Load `patcher` as the sampler does (its object patches applied; `force_full_load`: the weights
    are already on the device) and build the transformer_options the sampler passes: a clone of the
    patcher's model_options with its wrappers merged in (`comfy.sampler_helpers.prepare_model_patcher`)."""
    import comfy.sampler_helpers

    comfy.model_management.load_models_gpu([patcher], force_full_load=True)
    options = comfy.model_patcher.create_model_options_clone(patcher.model_options)
    comfy.sampler_helpers.prepare_model_patcher(patcher, {}, options)
    return options["transformer_options"]


def step(comfy, patcher, inputs: dict, device) -> dict:
    """One forward of the DiT; returns output (video, audio), seconds and the peak above the start."""
    import torch

    cuda = device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start_bytes = torch.cuda.memory_allocated(device)
    options = sampler_options(comfy, patcher)
    payload = {"audio_scale": 1.0, "seed": 0}
    began = time.perf_counter()
    with torch.inference_mode():
        out = patcher.model.diffusion_model(inputs["x"], inputs["timestep"], inputs["context"],
                                            transformer_options=options, minimax_payload=payload)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    result = {"seconds": round(seconds, 3), "output": [t.detach() for t in out]}
    if cuda:
        result["start_allocated_bytes"] = start_bytes
        result["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_above_start_bytes"] = result["max_memory_allocated_bytes"] - start_bytes
        result["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    result["nonfinite"] = int(sum((~torch.isfinite(t.float())).sum() for t in out))
    return result


def install_node(comfy, patcher, mode: str, head_chunks: int, ffn_chunks: int, budget_gb: float):
    """The H3Director DiT Memory node found by its id in `h3director.comfy.nodes_dit`, executed with the
    node's inputs; returns the patched MODEL, the installation's handle (for its report) when the
    integration exposes one, and how it was installed. Without the node module, the integration's
    `install` is called with the same settings."""
    from h3director.integrations import comfy_dit

    installed_handle = getattr(comfy_dit, "installed_handle", lambda _: None)
    try:
        import h3director.comfy.nodes_dit as nodes_dit
    except ImportError as error:
        budget = None if not budget_gb else int(budget_gb * GIB)
        patched, handle = comfy_dit.install(patcher, head_chunks=head_chunks, ffn_chunks=ffn_chunks, mode=mode,
                                            budget_bytes=budget)
        return patched, handle, f"h3director.integrations.comfy_dit.install (node module: {error})"
    node = None
    for value in vars(nodes_dit).values():
        schema = getattr(value, "define_schema", None)
        if isinstance(value, type) and schema is not None:
            with contextlib.suppress(Exception):
                if schema().node_id == NODE_ID:
                    node = value
                    break
    if node is None:
        raise SystemExit(f"dit_12gb: no node {NODE_ID!r} in h3director.comfy.nodes_dit")
    output = node.execute(model=patcher, mode=mode, head_chunks=head_chunks, ffn_chunks=ffn_chunks,
                          budget_gb=budget_gb)
    patched = output.args[0] if hasattr(output, "args") else output[0]
    return patched, installed_handle(patched), f"node {NODE_ID} ({node.__name__}.execute)"


def run_kernels(device: str, rows: int, out_dir: Path) -> dict:
    from h3director.dit.kernels import verify_kernels

    cache = out_dir / "kernels.json"
    os.environ["H3_KERNEL_CACHE"] = str(cache)
    report = verify_kernels(device, "bf16", rows=rows, cache=cache)
    return report.to_dict()


def compare(reference: list, other: list) -> dict:
    import torch

    equal = all(torch.equal(a, b) for a, b in zip(reference, other, strict=True))
    diffs = [float((a.float() - b.float()).abs().max()) for a, b in zip(reference, other, strict=True)]
    return {"torch_equal": equal, "max_abs_diff": diffs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    sys.path.insert(0, str(REPO))
    if args.smoke:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        config = dict(SMOKE_CONFIG)
        width, height, frames, text_tokens = 128, 64, 22, 16
    else:
        if not torch.cuda.is_available():
            print("dit_12gb: needs a CUDA GPU (torch.cuda.is_available() is False); "
                  "run with --smoke to check the plumbing on this machine", file=sys.stderr)
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
        config = {"num_layers": args.layers}
        width, height, frames, text_tokens = args.width, args.height, args.frames, args.text_tokens
    out_path = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "dit_12gb.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    result: dict = {"argv": sys.argv[1:] if argv is None else argv, "smoke": args.smoke, "device": str(device),
                    "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                    "config": config, "mode": args.mode, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if cuda:
        props = torch.cuda.get_device_properties(device)
        result.update(device_name=props.name, device_total_bytes=props.total_memory)

    def save() -> None:
        out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")

    if args.kernel_rows and not args.smoke:
        result["verify_kernels"] = run_kernels(str(device), args.kernel_rows, out_path.parent)
        save()

    comfy = import_comfy(cpu=not cuda, smoke=args.smoke)
    dtype = torch.bfloat16
    began = time.perf_counter()
    patcher = build_patcher(comfy, config, device, dtype, args.seed)
    inputs = make_inputs(config, width, height, frames, text_tokens, args.sigma, device, dtype, args.seed)
    result["geometry"] = inputs["geometry"]
    result["build_seconds"] = round(time.perf_counter() - began, 1)
    block_bytes = block_weight_bytes(patcher)
    result["block_weight_bytes"] = block_bytes
    if cuda:
        result["resident_bytes"] = torch.cuda.memory_allocated(device)
    save()

    reference = step(comfy, patcher, inputs, device)
    result["reference"] = {k: v for k, v in reference.items() if k != "output"}
    save()

    budget_gb = args.budget_gb
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        resident = torch.cuda.memory_allocated(device)
        cap = resident + int(args.card_gb * GIB) - 2 * block_bytes
        fraction = cap / result["device_total_bytes"]
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        result["cap"] = {"card_gb": args.card_gb, "resident_bytes": resident, "cap_bytes": cap,
                         "fraction": fraction, "activation_room_bytes": cap - resident}
        if budget_gb is None:
            budget_gb = cap / GIB
        if not args.skip_stock_under_cap:
            try:
                stock = step(comfy, patcher, inputs, device)
                result["stock_under_cap"] = {k: v for k, v in stock.items() if k != "output"}
                result["stock_under_cap"].update(compare(reference["output"], stock["output"]))
                del stock
            except torch.OutOfMemoryError as error:
                result["stock_under_cap"] = {"out_of_memory": str(error).splitlines()[0],
                                             "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device)}
            save()
    budget_gb = 0.0 if budget_gb is None else budget_gb
    result["node_inputs"] = {"mode": args.mode, "head_chunks": args.head_chunks, "ffn_chunks": args.ffn_chunks,
                             "budget_gb": budget_gb}
    patched, handle, how = install_node(comfy, patcher, args.mode, args.head_chunks, args.ffn_chunks, budget_gb)
    result["node_inputs"]["installed_by"] = how
    try:
        node = step(comfy, patched, inputs, device)
    except torch.OutOfMemoryError as error:
        result["node"] = {"out_of_memory": str(error).splitlines()[0],
                          "report": getattr(handle, "last_report", None)}
        save()
        print(json.dumps(result, indent=2, default=str))
        return 1
    result["node"] = {k: v for k, v in node.items() if k != "output"}
    result["node"].update(compare(reference["output"], node["output"]))
    result["node"]["report"] = getattr(handle, "last_report", None)
    result["node"]["time_ratio_to_reference"] = round(node["seconds"] / reference["seconds"], 3)
    save()
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
