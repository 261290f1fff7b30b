"""One pre-allocated `SlotPool` per device for the whole process, built from the configuration.

A pool is pre-allocated once and reused by every decode (CLI run, ComfyUI prompt): allocating
``pre_allocated_pool_mb`` per job would defeat it. `process_pool(config, device)` returns the pool
for ``device`` built from ``config`` (``SlotPool.from_config``), or None when the configuration asks
for none (level 0, or ``pre_allocated_pool_mb`` 0). A later call with a configuration that asks for
a different pool (size, slot, collections) on the same device drops the old one from the registry
(its memory returns once its last lease is gone) and builds the new one.
"""

from __future__ import annotations

import threading

import torch

from h3director.core.pool import SlotPool

_lock = threading.Lock()
_pools: dict[str, tuple[tuple, SlotPool]] = {}


def _settings(config) -> tuple:
    features = config.features()
    return (config.pool_bytes, config.pool_slot_bytes, features.generation_gc, config.generation_gc_interval_ms)


def process_pool(config, device: str | torch.device) -> SlotPool | None:
    """The process-wide pool for ``device`` that ``config`` (an `H3Config`) asks for, or None."""
    if not config.features().pool:
        return None
    key = str(torch.device(device))
    wanted = _settings(config)
    with _lock:
        held = _pools.get(key)
        if held is not None and held[0] == wanted:
            return held[1]
        pool = SlotPool.from_config(config, device)
        _pools[key] = (wanted, pool)
        return pool


def held_pools() -> dict[str, SlotPool]:
    """The pools built so far, by device (for stats and the monitor)."""
    with _lock:
        return {device: pool for device, (_, pool) in _pools.items()}


__all__ = ["held_pools", "process_pool"]
