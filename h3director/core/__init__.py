"""Memory truth: devices, monitor, guard, pool, shared store, fragmentation, OOM diagnosis, config."""

__all__: list[str] = []
