"""Peak of live tensor bytes during a piece of PyTorch code: the planner's measuring stick.

`LiveBytesTracker` is a `TorchDispatchMode`. Every tensor an operator returns is looked at once; its
*storage* is counted when first seen (so a view, a reshape or an in-place op adds nothing) and
uncounted when the storage is freed (a weak-reference finaliser on the storage). The running sum is
what a caching GPU allocator would have handed out for tensors created inside the block; its
maximum is `peak_bytes`. Tensors that existed before the block (weights, inputs) are not counted.

What it cannot see: scratch buffers an operator allocates and frees inside its own kernel (e.g. a
convolution's workspace) and rounding to allocator block sizes. It works on the `meta` device too,
which lets a full-size model be "run" without memory.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytesTracker(TorchDispatchMode):
    """Track live and peak bytes of tensor storages created inside the `with` block.

    Attributes (bytes): `live_bytes` now, `peak_bytes` the maximum of `live_bytes` so far.
    `reset_peak()` sets the peak to the current live bytes.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sizes: dict[int, int] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _forget(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)

    def _see(self, tensor: torch.Tensor, input_keys: set[int]) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        nbytes = storage.nbytes()
        known = self._sizes.get(key)
        if known is None and key in input_keys:
            return  # a view of, or in-place result on, a tensor from outside the block
        if known is None:
            self._sizes[key] = nbytes
            self.live_bytes += nbytes
            weakref.finalize(storage, self._forget, key)
        elif known != nbytes:  # resize_ or an out= argument that grew
            self._sizes[key] = nbytes
            self.live_bytes += nbytes - known
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        input_keys = {
            item.untyped_storage()._cdata
            for item in tree_flatten((args, kwargs))[0]
            if isinstance(item, torch.Tensor)
        }
        out = func(*args, **kwargs)
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._see(item, input_keys)
        return out


def peak_live_bytes(fn, *args, **kwargs) -> tuple[int, object]:
    """Run `fn(*args, **kwargs)` under a tracker; return (peak bytes above the start, fn's result)."""
    with LiveBytesTracker() as tracker:
        result = fn(*args, **kwargs)
    return tracker.peak_bytes, result


__all__ = ["LiveBytesTracker", "peak_live_bytes"]
