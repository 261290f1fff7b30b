"""Test-only ComfyUI custom node folder for tests/test_comfy_real_dit.py: `H3TestDiTConditioning`.

H3's text encoder (Qwen3-VL) is far too large for a test, so this node makes the CONDITIONING a text
encoder would: a seeded random `[1, length, dim]` float32 tensor with an empty options dict. Copied into a
temporary ComfyUI base directory by the test; never installed with the pack.
"""


class H3TestDiTConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"length": ("INT", {"default": 7, "min": 1, "max": 512}),
                             "dim": ("INT", {"default": 48, "min": 1, "max": 8192}),
                             "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, length, dim, seed):
        import torch

        generator = torch.Generator().manual_seed(seed)
        return ([[torch.randn(1, length, dim, generator=generator), {}]],)


class H3TestDiTSaveLatent:
    """Saves a LATENT's tensors (each stream of an AV `NestedTensor`) as `output/tensors/<name>.safetensors`."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "name": ("STRING", {"default": "latent"})}}

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, samples, name):
        import os

        import folder_paths
        import safetensors.torch

        latent = samples["samples"]
        streams = latent.unbind() if getattr(latent, "is_nested", False) else [latent]
        folder = os.path.join(folder_paths.get_output_directory(), "tensors")
        os.makedirs(folder, exist_ok=True)
        tensors = {f"stream{i}": t.contiguous() for i, t in enumerate(streams)}
        safetensors.torch.save_file(tensors, os.path.join(folder, f"{name}.safetensors"))
        return {}


NODE_CLASS_MAPPINGS = {"H3TestDiTConditioning": H3TestDiTConditioning, "H3TestDiTSaveLatent": H3TestDiTSaveLatent}
