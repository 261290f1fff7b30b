"""Test-only ComfyUI custom node folder for tests/test_keyframes_comfy_real.py: H3TestKeyframeSave writes an
IMAGE (safetensors, exact float32) or a STRING (text) to `output/keyframe_tensors/<name>`. Never installed with
the pack."""

import os

import folder_paths
import safetensors.torch


class H3TestKeyframeSave:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "images"})},
                "optional": {"images": ("IMAGE",), "text": ("STRING", {"forceInput": True})}}

    RETURN_TYPES = ()
    FUNCTION = "save"
    OUTPUT_NODE = True
    CATEGORY = "h3director_tests"

    def save(self, name, images=None, text=None):
        folder = os.path.join(folder_paths.get_output_directory(), "keyframe_tensors")
        os.makedirs(folder, exist_ok=True)
        if images is not None:
            safetensors.torch.save_file({"images": images.contiguous().cpu()}, os.path.join(folder, f"{name}.safetensors"))
        if text is not None:
            with open(os.path.join(folder, f"{name}.txt"), "w") as handle:
                handle.write(text)
        return {}


NODE_CLASS_MAPPINGS = {"H3TestKeyframeSave": H3TestKeyframeSave}
