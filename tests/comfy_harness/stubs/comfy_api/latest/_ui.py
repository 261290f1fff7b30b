"""Stand-in for `comfy_api/latest/_ui.py`: `SavedResult` and `PreviewVideo` (same fields and dict)."""

from __future__ import annotations


class SavedResult(dict):
    def __init__(self, filename: str, subfolder: str, type):
        super().__init__(filename=filename, subfolder=subfolder, type=type.value)


class PreviewVideo:
    def __init__(self, values, **kwargs):
        self.values = values

    def as_dict(self):
        return {"images": self.values, "animated": (True,)}
