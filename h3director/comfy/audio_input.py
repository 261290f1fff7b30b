"""ComfyUI AUDIO values as the nodes take them: ``{"waveform": [B, channels, samples], "sample_rate": Hz}``."""

from __future__ import annotations

from typing import Any

from h3director.errors import InvalidInputError


def audio_input(value: Any, name: str = "audio") -> tuple[Any, int]:
    """``(waveform, sample_rate)`` of an AUDIO dict; anything without both keys is an `InvalidInputError`
    naming the input `name`. The waveform's type and shape are the caller's to check."""
    if not isinstance(value, dict) or "waveform" not in value or "sample_rate" not in value:
        raise InvalidInputError(f"{name} must be an AUDIO dict with 'waveform' and 'sample_rate'")
    return value["waveform"], int(value["sample_rate"])


__all__ = ["audio_input"]
