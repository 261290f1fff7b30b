"""Stand-in for `comfy/model_management.py` on a CPU-only ComfyUI (`--cpu`).

Same function names and signatures as the real module: `get_torch_device`, `get_total_memory`,
`get_free_memory`, `free_memory`, `load_models_gpu`, `soft_empty_cache`, `is_oom`, `unload_all_models`,
`intermediate_device`. Calls are recorded in `calls` so tests can check what the pack asked for.
"""

import psutil
import torch

calls: list[tuple] = []


def get_torch_device():
    return torch.device("cpu")


def intermediate_device():
    return torch.device("cpu")


def get_total_memory(dev=None, torch_total_too=False):
    return psutil.virtual_memory().total


def get_free_memory(dev=None, torch_free_too=False):
    return psutil.virtual_memory().available


def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False, pins_required=0, ram_required=0):  # noqa: B006
    calls.append(("free_memory", int(memory_required), str(device)))


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                    force_full_load=False):
    calls.append(("load_models_gpu", len(models), int(memory_required)))


def soft_empty_cache(force=False):
    calls.append(("soft_empty_cache",))


def is_oom(e):
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def unload_all_models():
    calls.append(("unload_all_models",))
