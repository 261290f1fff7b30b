"""Test-only ComfyUI custom node folder for tests/test_panel_browser.py.

`H3TestHoldMemory` (IMAGE in, INT out; an output node) allocates `mib` MiB of host memory, touches
every page, and keeps it for `seconds` before it returns, so a page watching the server sees a node
running with memory held. Copied into a temporary ComfyUI base directory by the test; never
installed with the pack.
"""

import time


class HoldMemory:
    CATEGORY = "H3 Director test"
    RETURN_TYPES = ("INT",)
    FUNCTION = "hold"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE",), "mib": ("INT", {"default": 256, "min": 1, "max": 4096}),
                             "seconds": ("FLOAT", {"default": 3.0, "min": 0.0, "max": 60.0})}}

    def hold(self, image, mib, seconds):
        import torch

        held = torch.ones(mib * 1024 * 1024, dtype=torch.uint8)   # ones: every page touched, so resident
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
        total = int(held[:: 4096].sum()) + int(image.shape[0])
        del held
        return {"ui": {"text": (str(total),)}, "result": (total,)}


NODE_CLASS_MAPPINGS = {"H3TestHoldMemory": HoldMemory}
