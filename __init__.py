"""ComfyUI entry point: this repository cloned into `ComfyUI/custom_nodes/` is a node pack.

ComfyUI imports this file as a package. It must stay importable without installing anything
and must not be picked up by `pip install` (the package is `h3director/`).
"""

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
