"""Stand-in for `comfy/patcher_extension.py`: `WrappersMP` names and `WrapperExecutor`'s calling convention.

A wrapper is called as ``wrapper(executor, *args, **kwargs)`` and continues the chain with
``executor(*args, **kwargs)``, as in the real `WrapperExecutor`.
"""


class WrappersMP:
    OUTER_SAMPLE = "outer_sample"
    APPLY_MODEL = "apply_model"
    DIFFUSION_MODEL = "diffusion_model"


class WrapperExecutor:
    def __init__(self, original, wrappers, idx=0):
        self.original, self.wrappers, self.idx = original, wrappers, idx

    def __call__(self, *args, **kwargs):
        if self.idx >= len(self.wrappers):
            return self.original(*args, **kwargs)
        return self.wrappers[self.idx](WrapperExecutor(self.original, self.wrappers, self.idx + 1), *args, **kwargs)
