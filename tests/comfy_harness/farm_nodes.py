"""Test-only single-file ComfyUI custom node for the farm tests (copied into a temporary base folder).

H3TestFarmDecodeCapped passes a LATENT through, and stands for a decode step on a device whose
allocator fails above `limit_gb`: when the farm's decode budget (`budget_gb`, set by the farm on every
decode node with that input) is larger, it raises a real `torch.OutOfMemoryError` with PyTorch's CUDA
message format, so the farm's out-of-memory path (cheaper rung, then `h3director oom`'s diagnosis)
runs as it would on a GPU.
"""

import torch


class H3TestFarmDecodeCapped:
    CATEGORY = "H3 Director tests"
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",),
                             "budget_gb": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1024.0, "step": 0.0001}),
                             "limit_gb": ("FLOAT", {"default": 1024.0, "min": 0.0, "max": 1024.0, "step": 0.0001})}}

    def run(self, samples, budget_gb, limit_gb):
        if budget_gb > limit_gb:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {budget_gb * 1024:.2f} MiB. GPU 0 has a total capacity of "
                f"{limit_gb:.2f} GiB of which 0 bytes is free. Including non-PyTorch memory, this process has "
                f"{limit_gb:.2f} GiB memory in use. Of the allocated memory {limit_gb:.2f} GiB is allocated by "
                "PyTorch, and 0 bytes is reserved by PyTorch but unallocated. (injected by H3TestFarmDecodeCapped)")
        return (samples,)


NODE_CLASS_MAPPINGS = {"H3TestFarmDecodeCapped": H3TestFarmDecodeCapped}
