"""H3Director GGUF DiT Loader: a MiniMax H3 DiT `.gguf` -> MODEL of ComfyUI's own H3 model.

Files are listed from ComfyUI's `diffusion_models` folders (`models/diffusion_models` and the legacy
`models/unet`, plus any extra paths configured for them). The linear weights stay quantised and are
dequantised per layer on use (`h3director.integrations.comfy_gguf`); LoRA, lowvram and the DiT Memory
node work on the MODEL as on a safetensors one. A malformed file, another architecture or tensors that do
not fit the detected model are refused with one line naming the file and the problem.
"""

from __future__ import annotations

import os

from comfy_api.latest import io

FOLDER = "diffusion_models"
DTYPES = {"default": None, "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def gguf_files() -> list[str]:
    """`.gguf` files under ComfyUI's diffusion model folders, as names relative to their folder (sorted)."""
    import folder_paths

    names = set()
    roots = folder_paths.get_folder_paths(FOLDER) if hasattr(folder_paths, "get_folder_paths") else []
    for root in roots:
        if not os.path.isdir(root):
            continue
        for dirpath, _, files in os.walk(root, followlinks=True):
            for name in files:
                if name.lower().endswith(".gguf"):
                    names.add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(names)


def resolve(name: str) -> str:
    """The full path of `name` in the diffusion model folders; `InvalidInputError` when absent."""
    import folder_paths

    from h3director.errors import InvalidInputError

    if not name.lower().endswith(".gguf"):
        raise InvalidInputError(f"H3Director GGUF DiT Loader takes .gguf files, got {name!r}")
    path = folder_paths.get_full_path(FOLDER, name)
    if path is None:
        for root in folder_paths.get_folder_paths(FOLDER):
            candidate = os.path.join(root, name)
            if os.path.isfile(candidate):
                path = candidate
                break
    if path is None:
        raise InvalidInputError(f"{name!r} is not in ComfyUI's diffusion model folders "
                                f"({', '.join(folder_paths.get_folder_paths(FOLDER))})")
    return path


class GGUFDiTLoader(io.ComfyNode):
    """Node `H3DirectorGGUFDiTLoader`: `gguf_name` (a file in ComfyUI's `diffusion_models` folders) +
    `weight_dtype` -> MODEL, ComfyUI's own H3 model with quantised linear weights dequantised per layer on
    use. InvalidInputError, naming the file, for a missing or malformed file, another architecture, or
    tensors that do not fit the detected model."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorGGUFDiTLoader",
            display_name="H3Director GGUF DiT Loader",
            category="H3 Director/loaders",
            description="Loads a MiniMax H3 DiT GGUF (general.architecture minimax_h3, or H3 tensors labelled "
                        "wan) as ComfyUI's own H3 model. Linear weights stay quantised in memory and are "
                        "dequantised one layer at a time on use; patch projections, time embedder or "
                        "adaln_t_table, output heads and norms are used as stored.",
            inputs=[io.Combo.Input("gguf_name", options=gguf_files(),
                                   tooltip="a .gguf in models/diffusion_models or models/unet"),
                    io.Combo.Input("weight_dtype", options=list(DTYPES), default="default",
                                   tooltip="dtype of the dequantised weights and of the unquantised tensors; "
                                           "default: ComfyUI's choice for the device")],
            outputs=[io.Model.Output(display_name="model")],
        )

    @classmethod
    def execute(cls, gguf_name, weight_dtype="default") -> io.NodeOutput:
        import torch

        from h3director.errors import InvalidInputError
        from h3director.integrations.comfy_gguf import load_gguf_dit

        if weight_dtype not in DTYPES:
            raise InvalidInputError(f"weight_dtype must be one of {list(DTYPES)}, got {weight_dtype!r}")
        dtype = getattr(torch, DTYPES[weight_dtype]) if DTYPES[weight_dtype] else None
        model = load_gguf_dit(resolve(gguf_name), dtype=dtype)
        summary = model.model.gguf_summary
        text = (f"{os.path.basename(gguf_name)}: {summary['detection']}\n"
                f"{summary['quantised']} quantised linears ({summary['quantised_bytes'] / 2**20:.1f} MiB, "
                f"dequantised per layer on use), {summary['as_stored']} tensors as stored, "
                f"weights {summary['dtype']}")
        return io.NodeOutput(model, ui={"text": (text,)})


__all__ = ["GGUFDiTLoader"]
