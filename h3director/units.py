"""Human-readable sizes at the edges; bytes everywhere else.

`parse_size("24GB")` and `parse_size("512MiB")` return bytes. Decimal suffixes (KB, MB, GB, TB)
are powers of 1000 and binary ones (KiB, MiB, GiB, TiB) powers of 1024, except that a bare
"G"/"M"/"K" or the GPU-market spelling of a card ("24GB" for VRAM) is read as the user means it:
set `binary_gb=True` to read decimal suffixes as binary, as `nvidia-smi` and PyTorch do.
"""

from __future__ import annotations

import re

from h3director.errors import InvalidInputError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS_DECIMAL = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
                  "t": 10**12, "tb": 10**12}
_UNITS_BINARY = {"kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, *, binary_gb: bool = False) -> int:
    """Parse a size such as ``"24GB"``, ``"512MiB"``, ``"1.5 GiB"`` or ``1048576`` into bytes.

    With ``binary_gb=True`` the decimal suffixes K/KB, M/MB, G/GB, T/TB mean powers of 1024, which
    is how GPU memory is quoted ("a 24GB card" has 24 GiB). Raises `InvalidInputError` naming the
    text and the accepted suffixes when it cannot be read.
    """
    if isinstance(text, bool):
        raise InvalidInputError(f"size must be a number or text like '24GB', got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise InvalidInputError(f"size must not be negative, got {text!r}")
        return int(text)
    match = _SIZE_RE.match(str(text))
    if not match:
        raise InvalidInputError(
            f"cannot read size {text!r}: expected a number with an optional unit, e.g. '24GB', '512MiB', '1.5GiB'"
        )
    value, unit = float(match.group(1)), match.group(2).lower()
    if unit in _UNITS_BINARY:
        factor = _UNITS_BINARY[unit]
    elif unit in _UNITS_DECIMAL:
        factor = _UNITS_DECIMAL[unit]
        if binary_gb and factor > 1:
            factor = 1024 ** {10**3: 1, 10**6: 2, 10**9: 3, 10**12: 4}[factor]
    else:
        raise InvalidInputError(
            f"unknown size unit {match.group(2)!r} in {text!r}: use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB"
        )
    return int(round(value * factor))


def format_size(num_bytes: int | float, *, precision: int = 2) -> str:
    """Format bytes with binary units: ``format_size(12_582_912) == '12.00 MiB'``."""
    value = float(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


__all__ = ["GiB", "KiB", "MiB", "format_size", "parse_size"]
