"""Test stand-in for ComfyUI's `comfy_api` package (see `latest/__init__.py`)."""
