"""Audio/video timing: A/V offset measurement, sample-exact shifting and stitching (plain numpy + PyAV).

Sits beside `video/` (layer 3), below it: it imports `core/` and below, never `video/`, diffusers or ComfyUI
(`video/` uses its media files and timeline; `tests/test_import_graph.py` checks the direction).
Convention used throughout: an offset in milliseconds is positive when the audio is late (a sound
comes after the picture event it belongs to).
"""

__all__: list[str] = []
