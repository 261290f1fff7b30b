"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: does H3's DiT take a latent with no audio rows?

Usage: python video_only_rows.py COMFYUI_DIR -> prints one JSON line: for 0 and 9 audio latent frames, the shapes
of the video and audio velocities the tiny DiT (`dit_worker`, ComfyUI's own `MiniMaxH3Model`) returns for the same
video latent, text states and timestep, whether they are finite, and the largest difference of the video velocity
between the two (the video rows attend to the audio rows in a joint forward).
"""

from __future__ import annotations

import json
import sys


def main(root: str) -> dict:
    import dit_worker

    h3 = dit_worker.import_comfy(root)
    import comfy.model_management
    import torch

    patcher = dit_worker.load(dit_worker.tiny_state_dict(h3), torch.float32)
    comfy.model_management.load_models_gpu([patcher])
    model = patcher.model.diffusion_model
    generator = torch.Generator().manual_seed(1)
    video = torch.randn(1, 24, 7, 6, 4, generator=generator)
    context = torch.randn(1, 7, dit_worker.CONFIG["text_dim"], generator=generator)
    audio = torch.randn(1, 32, 2, 9, generator=generator)
    out = {}
    velocities = {}
    for frames in (0, 9):
        with torch.no_grad():
            v, a = model([video.clone(), audio[..., :frames].clone()], torch.tensor([600.0]), context,
                         transformer_options={})
        velocities[frames] = v
        out[str(frames)] = {"video": list(v.shape), "audio": list(a.shape),
                            "finite": bool(torch.isfinite(v).all() and torch.isfinite(a).all())}
    out["video_max_difference"] = float((velocities[0] - velocities[9]).abs().max())
    return out


if __name__ == "__main__":
    print("VIDEO-ONLY " + json.dumps(main(sys.argv[1])))
