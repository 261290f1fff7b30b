"""Stand-in for ComfyUI's `comfy` package: only the modules the H3 Director pack calls."""
