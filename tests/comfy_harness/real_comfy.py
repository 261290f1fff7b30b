"""Test-only helpers that run INSIDE a real ComfyUI (its Python, its modules). Not part of the pack.

ComfyUI builds `MiniMaxH3VideoVAE` and `MiniMaxH3AudioVAE` at their released sizes (a 2.4 B
parameter ViT decoder) whatever the weights file holds, so a test cannot load small random
weights as they are. `apply_tiny_shapes()` changes the constructor DEFAULTS of ComfyUI's own classes
(`comfy/ldm/minimax/vae.py` `ViT3DDecoder`, `MiniMaxH3VideoVAE`; `comfy/ldm/minimax/audio_vae.py`
`MiniMaxH3AudioVAE`) to small widths; the code paths (temporal chunking, 256 px spatial tiling,
blending, finalisation, BigVGAN) are ComfyUI's, unchanged. `write_tiny_weights()` saves random
weights of those shapes in ComfyUI's key layout, which `comfy.sd.VAE` detects as MiniMax H3.

As a custom node folder (`tests/comfy_harness/real_node/__init__.py` loads this file), it also
registers `H3TestSaveTensor`, which saves an IMAGE or AUDIO waveform as safetensors (and a STRING as
`<name>.txt`) in the output folder so the test can compare tensors bit for bit over the file system.
"""

from __future__ import annotations

import inspect
import os


def mmap_threshold_is_pinned() -> bool | None:
    """Whether glibc's mmap threshold is a fixed value of at most 2 MiB in this process, read from malloc's
    behaviour (glibc has no getter); None without glibc.

    It allocates and frees 8 MiB, which under glibc's dynamic threshold raises the threshold to 8 MiB (or
    finds it there already), then allocates 2 MiB and reads whether glibc served it with mmap: the
    IS_MMAPPED bit (0x2) of the chunk's size field, the word just before the returned pointer. Dynamic: from
    the heap (False). Pinned at <= 2 MiB (the director's default is 1 MiB): mmapped (True)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    libc.free(libc.malloc(8 << 20))
    probe = libc.malloc(2 << 20)
    try:
        return bool(ctypes.c_size_t.from_address(probe - ctypes.sizeof(ctypes.c_size_t)).value & 0x2)
    finally:
        libc.free(probe)


def _set_defaults(function, **values) -> None:
    params = list(inspect.signature(function).parameters.values())[1:]
    defaults = list(function.__defaults__)
    first = len(params) - len(defaults)
    for name, value in values.items():
        index = [p.name for p in params].index(name) - first
        defaults[index] = value
    function.__defaults__ = tuple(defaults)


def apply_tiny_shapes() -> None:
    import comfy.ldm.minimax.audio_vae as audio_vae
    import comfy.ldm.minimax.vae as video_vae

    if getattr(video_vae, "_h3_test_tiny", False):
        return
    _set_defaults(video_vae.ViT3DDecoder.__init__, num_layers=2, heads=2, dim_head=16)
    _set_defaults(video_vae.MiniMaxH3VideoVAE.__init__, ch=32, ch_mult=(1, 1, 1, 1, 1, 1), num_res_blocks=1)
    _set_defaults(audio_vae.MiniMaxH3AudioVAE.__init__, encoder_dim=4, latent_dim=64, decoder_dim=128)
    video_vae._h3_test_tiny = True


def write_tiny_weights(video_path: str, audio_path: str, seed: int = 0) -> None:
    import comfy.ldm.minimax.audio_vae as audio_vae
    import comfy.ldm.minimax.vae as video_vae
    import safetensors.torch
    import torch

    apply_tiny_shapes()
    generator = torch.Generator().manual_seed(seed)
    for model, path in ((video_vae.MiniMaxH3VideoVAE(), video_path), (audio_vae.MiniMaxH3AudioVAE(), audio_path)):
        state = {}
        for name, tensor in sorted(model.state_dict().items()):
            if name == "latents_std":
                value = 0.5 + torch.rand(tensor.shape, generator=generator)
            elif name == "latents_mean":
                value = torch.rand(tensor.shape, generator=generator) - 0.5
            elif name.endswith(("norm1.weight", "norm2.weight", "norm_out.weight")) or "scale" in name:
                value = 1.0 + 0.1 * torch.randn(tensor.shape, generator=generator)
            else:
                value = 0.1 * torch.randn(tensor.shape, generator=generator)
            state[name] = value.to(torch.float32).contiguous()
        safetensors.torch.save_file(state, path)


class H3TestSaveTensor:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "tensor"})},
                "optional": {"image": ("IMAGE",), "audio": ("AUDIO",), "text": ("STRING", {"forceInput": True})}}

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def save(self, name, image=None, audio=None, text=None):
        import folder_paths
        import safetensors.torch

        tensors = {}
        if image is not None:
            tensors["image"] = image.contiguous()
        if audio is not None:
            tensors["waveform"] = audio["waveform"].contiguous()
        folder = os.path.join(folder_paths.get_output_directory(), "tensors")
        os.makedirs(folder, exist_ok=True)
        if tensors:
            safetensors.torch.save_file(tensors, os.path.join(folder, f"{name}.safetensors"))
        if text is not None:
            with open(os.path.join(folder, f"{name}.txt"), "w") as file:
                file.write(text)
        return {}


class H3TestFailAllocations:
    """Passes the VAE through after arming its decoder: its next `failures` calls each make a real allocation the
    CPU allocator refuses (`torch.empty` of 2**50 bytes: the allocator's own "can't allocate memory" error, not a
    raised stand-in), then the decoder runs as before and the wrapper removes itself."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), "failures": ("INT", {"default": 1, "min": 0, "max": 100})}}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "arm"
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, vae, failures):
        return float("nan")                         # arm on every prompt

    def arm(self, vae, failures):
        import torch

        decoder = vae.first_stage_model.decoder
        original = decoder.forward
        left = [failures]

        def forward(*args, **kwargs):
            if left[0] > 0:
                left[0] -= 1
                if left[0] == 0:
                    del decoder.forward               # back to the class's forward
                torch.empty(1 << 50, dtype=torch.uint8)
            return original(*args, **kwargs)

        if failures:
            decoder.forward = forward
        return (vae,)


class H3TestMmapProbe:
    """Writes `mmap_threshold_is_pinned()` of the server process ("True", "False" or "None") to
    `tensors/<name>.txt` in the output folder; its IMAGE input only orders it after the node that makes it."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "mmap"}), "image": ("IMAGE",)}}

    RETURN_TYPES = ()
    FUNCTION = "probe"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, name, image):
        return float("nan")

    def probe(self, name, image):
        import folder_paths

        folder = os.path.join(folder_paths.get_output_directory(), "tensors")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.txt"), "w") as file:
            file.write(str(mmap_threshold_is_pinned()))
        return {}


NODE_CLASS_MAPPINGS = {"H3TestSaveTensor": H3TestSaveTensor, "H3TestFailAllocations": H3TestFailAllocations,
                       "H3TestMmapProbe": H3TestMmapProbe}
