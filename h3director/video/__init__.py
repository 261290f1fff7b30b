"""Streaming decode scheduler, sinks, tiled spatial ops and frame ops. Knows nothing of VAEs."""

__all__: list[str] = []
