"""Stand-in for `comfy/utils.py`: `ProgressBar` with `update_absolute(value, total)`; records updates."""

updates: list[tuple[int, int]] = []


class ProgressBar:
    def __init__(self, total, node_id=None):
        self.total, self.current = total, 0

    def update_absolute(self, value, total=None, preview=None):
        self.current = value
        updates.append((value, total if total is not None else self.total))
