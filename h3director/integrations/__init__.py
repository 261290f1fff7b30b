"""Adapters to real frameworks (diffusers, ComfyUI). The only layer that imports them."""

__all__: list[str] = []
