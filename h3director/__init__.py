"""H3 Director: bounded, visible memory for long MiniMax H3 video generation.

Importing this package is cheap: it imports neither diffusers, ComfyUI nor matplotlib.
Those are imported by the modules that need them, when they are used.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
