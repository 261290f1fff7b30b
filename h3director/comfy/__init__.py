"""ComfyUI node pack. Imports ComfyUI lazily, only when ComfyUI loads the pack."""
