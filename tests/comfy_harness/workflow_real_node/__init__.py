"""Test-only ComfyUI custom node folder for tests/test_plan_workflow_comfy_real.py. Never installed with the pack.

- ``POST /h3test/validate`` with ``{"prompt": {...}}``: runs ComfyUI's own `execution.validate_prompt` on an
  API-format workflow and answers ``{"valid", "error", "node_errors"}`` without queueing it (the workflows of
  the grid name models at H3's real size, which a test machine cannot run).
- ``H3TestImageToVideo``: what `MiniMaxH3ImageToVideo` returns for text-to-video (CONDITIONING, the empty AV
  latent of ComfyUI's own `_empty_av_latent`) with a seeded random ``[1, 7, 48]`` text state in place of the
  Qwen3-VL encoder (far too large for a test; 48 is the tiny test DiT's text width). A render test swaps it in
  for CLIPLoader + MiniMaxH3ImageToVideo and runs the rest of a written workflow unchanged.
"""

import execution
from server import PromptServer


@PromptServer.instance.routes.post("/h3test/validate")
async def _validate(request):
    from aiohttp import web

    body = await request.json()
    valid = await execution.validate_prompt("h3test", body["prompt"], None)
    return web.json_response({"valid": bool(valid[0]), "error": valid[1], "node_errors": valid[3]})


class H3TestImageToVideo:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"prompt": ("STRING", {"default": ""}),
                             "width": ("INT", {"default": 64, "min": 32, "max": 4096, "step": 32}),
                             "height": ("INT", {"default": 64, "min": 32, "max": 4096, "step": 32}),
                             "length": ("INT", {"default": 22, "min": 5, "max": 3600})}}

    RETURN_TYPES = ("CONDITIONING", "LATENT")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, prompt, width, height, length):
        import torch
        from comfy_extras.nodes_minimax_h3 import _empty_av_latent

        latent, _ = _empty_av_latent(width, height, length)
        states = torch.randn(1, 7, 48, generator=torch.Generator().manual_seed(len(prompt)))
        return ([[states, {}]], latent)


NODE_CLASS_MAPPINGS = {"H3TestImageToVideo": H3TestImageToVideo}
