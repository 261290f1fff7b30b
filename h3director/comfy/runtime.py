"""The few ComfyUI services the nodes use, imported when called (ComfyUI is importable only inside it), and what
the running prompt is (from its `PromptServer`: `running_prompt`, `prompt_node`, `running_node`).

Mirrors of these functions in the test harness (`fixtures/comfy_harness/`) keep the same signatures:
`folder_paths.get_output_directory`, `folder_paths.get_temp_directory`,
`folder_paths.get_save_image_path`, and `comfy.model_management.{free_memory, get_free_memory,
get_total_memory, load_models_gpu, soft_empty_cache, get_torch_device, unload_all_models}`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SaveTarget:
    """Where an output file goes: `path` inside ComfyUI's output folder, and the UI's `filename`/`subfolder`."""

    path: Path
    filename: str
    subfolder: str


def output_directory() -> Path:
    """ComfyUI's output folder (`folder_paths.get_output_directory()`), resolved."""
    import folder_paths

    return Path(folder_paths.get_output_directory()).resolve()


def temp_directory() -> Path:
    """ComfyUI's temp folder (`folder_paths.get_temp_directory()`), resolved."""
    import folder_paths

    return Path(folder_paths.get_temp_directory()).resolve()


def save_target(filename_prefix: str, width: int, height: int, extension: str) -> SaveTarget:
    """Next free `<prefix>_<counter:05>_.<extension>` under the output folder, as ComfyUI's SaveVideo names files.

    ComfyUI's `get_save_image_path` refuses prefixes that leave the output folder.
    """
    import folder_paths

    from h3director.errors import InvalidInputError

    root = output_directory()
    wanted = (root / os.path.normpath(filename_prefix)).resolve()
    if os.path.isabs(filename_prefix) or not wanted.is_relative_to(root) or wanted == root:
        raise InvalidInputError(f"filename_prefix {filename_prefix!r} must name a file inside ComfyUI's output "
                                f"folder {root} (no absolute paths, no '..')")
    folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(
        filename_prefix, str(root), width, height)
    os.makedirs(folder, exist_ok=True)
    name = f"{filename}_{counter:05}_.{extension}"
    return SaveTarget(path=Path(folder) / name, filename=name, subfolder=subfolder)


def torch_device():
    """ComfyUI's main torch device (`--cpu` makes it the CPU)."""
    import comfy.model_management

    return comfy.model_management.get_torch_device()


def total_bytes(device) -> int:
    """Total memory of `device` as ComfyUI counts it (host RAM for the CPU)."""
    import comfy.model_management

    return int(comfy.model_management.get_total_memory(device))


def free_device_memory(bytes_needed: int, device) -> None:
    """Ask ComfyUI to unload other models until `bytes_needed` are free on `device`."""
    import comfy.model_management

    comfy.model_management.free_memory(bytes_needed, device)
    comfy.model_management.soft_empty_cache()


def unload_models_and_empty_caches() -> None:
    """Unload every model ComfyUI holds on its devices and empty the allocator caches (the guard's stop)."""
    import comfy.model_management

    comfy.model_management.unload_all_models()
    comfy.model_management.soft_empty_cache()


def free_bytes(device) -> int:
    """Free bytes on `device` as ComfyUI's model management counts them (`get_free_memory`)."""
    import comfy.model_management

    return int(comfy.model_management.get_free_memory(device))


def load_vae(vae, bytes_needed: int) -> None:
    """Load `vae`'s weights the way `comfy.sd.VAE.decode` does, reserving `bytes_needed` for one clip."""
    import comfy.model_management

    comfy.model_management.load_models_gpu([vae.patcher], memory_required=bytes_needed,
                                           force_full_load=getattr(vae, "disable_offload", False))


def _prompt_server() -> Any:
    try:
        from server import PromptServer
    except ImportError:
        return None
    return getattr(PromptServer, "instance", None)


def running_prompt(prompt_id: str, server: Any = None) -> dict[str, Any] | None:
    """The API prompt (node id -> node dict) of the running prompt ``prompt_id``, or None."""
    queue = getattr(server or _prompt_server(), "prompt_queue", None)
    if queue is None:
        return None
    for item in queue.get_current_queue_volatile()[0]:
        if str(item[1]) == str(prompt_id) and isinstance(item[2], dict):
            return item[2]
    return None


def prompt_node(prompt_id: str, node_id: str, server: Any = None) -> dict[str, Any] | None:
    """The node ``node_id`` of the running prompt ``prompt_id`` (its dict in the API prompt), or None."""
    prompt = running_prompt(prompt_id, server)
    node = None if prompt is None else prompt.get(str(node_id))
    return node if isinstance(node, dict) else None


def running_node(server: Any = None) -> dict[str, Any] | None:
    """The node ComfyUI executes now, from its `PromptServer` (None when idle or outside ComfyUI).

    ComfyUI records the node it executes only for prompts queued with a client_id (the page does so).
    """
    server = server or _prompt_server()
    queue = getattr(server, "prompt_queue", None)
    if queue is None:
        return None
    running, _pending = queue.get_current_queue_volatile()
    if not running:
        return None
    item = running[0]
    prompt_id, prompt = item[1], item[2]
    node_id = getattr(server, "last_node_id", None)
    node = prompt.get(str(node_id)) if isinstance(prompt, dict) and node_id is not None else None
    node = node if isinstance(node, dict) else {}
    meta = node.get("_meta") if isinstance(node.get("_meta"), dict) else {}
    return {"prompt_id": prompt_id, "node_id": None if node_id is None else str(node_id),
            "class_type": node.get("class_type"), "title": meta.get("title")}


__all__ = ["SaveTarget", "free_bytes", "free_device_memory", "load_vae", "output_directory", "prompt_node",
           "running_node", "running_prompt", "save_target", "temp_directory", "torch_device", "total_bytes", "unload_models_and_empty_caches"]
