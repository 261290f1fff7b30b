"""Resumable sampling: checkpoints of a sampler's state that a killed render continues from.

`checkpoint` holds the framework-neutral parts: the on-disk checkpoint (a safetensors file with the
latent, the sampler's state tensors, the run's key and per-tensor CRC32s), written atomically every k
steps, the last two kept, corrupt files skipped with a warning, a full disk turned into a warning.
`fingerprint` digests what a run consumes (tensors, nested conditioning) into short key strings.
The framework adapters live in `integrations/comfy_resume.py` (ComfyUI's k-diffusion samplers) and
`integrations/diffusers_resume.py` (the diffusers H3 denoising loop).
"""

__all__: list[str] = []
