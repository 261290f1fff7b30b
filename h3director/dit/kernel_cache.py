"""The on-disk record of which kernel properties were verified, and on exactly which software and device.

A result of `h3director.dit.kernels.verify_kernels` holds only for the device and libraries it ran on:
cuBLAS picks GEMM kernels by shape, GPU model and library version, so a property verified under one
torch/CUDA/cuBLAS build says nothing about another. Each cache entry therefore carries a *key*:

- ``device_name``: ``torch.cuda.get_device_name`` for CUDA/ROCm, ``"cpu: <processor model>"`` for the
  CPU, ``"mps: <machine>"`` for Apple silicon;
- ``torch``, ``cuda`` (``torch.version.cuda``), ``hip`` (``torch.version.hip``), ``cublas`` (the version
  of the cuBLAS library loaded in this process, or of the pip package that ships it), ``cpu_libraries``
  (the oneDNN/MKL versions torch reports, for the CPU only); absent items are ``None``;
- ``dtype``: ``"bf16"``, ``"fp16"`` or ``"fp32"``;
- ``threads``: ``torch.get_num_threads()`` on the CPU (where an elementwise kernel's thread ranges decide
  which elements take its scalar tail: `h3director.dit.thread_split`), None elsewhere.

An entry is trusted only when its key equals the running process's key field for field, only for
the layer widths it was verified at, and only for its *row class* (`row_class`: the power-of-two band
of packed rows its ``rows`` falls in; GEMM libraries choose kernels by shape, so a check at 1,024 rows
says nothing about 38,000). One entry is kept per key, widths and row class. The file (default ``~/.cache/h3director/kernels.json``,
``$H3_KERNEL_CACHE`` overrides) is written atomically (`h3director.core.atomic_file`) and validated on
read: over `MAX_CACHE_BYTES`, not JSON, or not the shape below, it is reported (`CacheRead.problem`)
and none of it is trusted.

    {"format": "h3director-kernels", "version": 2,
     "entries": [{"key": {...}, "widths": {...}, "rows": 1024, "verified": [...], "failed": [...],
                  "date": "2026-11-30T18:00:00+00:00", "results": {...}}]}
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from h3director.core.atomic_file import atomic_path
from h3director.core.devices import parse_device
from h3director.dit.tiers import KERNEL_PROPERTIES

CACHE_FORMAT = "h3director-kernels"
CACHE_VERSION = 2
"""2: keys carry ``threads`` and entries are per row class (version 1 files are reported, not trusted)."""
MAX_CACHE_BYTES = 1 << 20
"""A cache file larger than this (1 MiB) is refused unread: a real one holds a few KiB."""
MAX_ENTRIES = 64
"""Entries kept when writing (newest first); older device/library combinations fall off."""
KEY_FIELDS = ("device_name", "torch", "cuda", "hip", "cublas", "cpu_libraries", "dtype", "threads")
_CUBLAS_PACKAGES = ("nvidia-cublas-cu13", "nvidia-cublas-cu12", "nvidia-cublas-cu11", "nvidia-cublas")


def default_cache_path() -> Path:
    """``$H3_KERNEL_CACHE`` when set, else ``~/.cache/h3director/kernels.json``."""
    override = os.environ.get("H3_KERNEL_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "h3director" / "kernels.json"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"


def _cpu_libraries(torch) -> str | None:
    """The CPU math libraries torch was built with and the kernel set it dispatches to, e.g.
    ``"Math Kernel Library Version 2024.2; MKL-DNN v3.12.0; capability AVX512"`` (from
    ``torch.__config__.show()`` and ``torch.backends.cpu.get_cpu_capability()``)."""
    found = []
    with contextlib.suppress(Exception):  # a build without the config string still has a key
        text = torch.__config__.show()
        for pattern in (r"Math Kernel Library Version [\w.]+", r"(?:MKL-DNN|oneDNN) v[\w.]+", r"OpenBLAS [\w.]+"):
            match = re.search(pattern, text)
            if match:
                found.append(match.group(0))
    with contextlib.suppress(Exception):  # ATEN_CPU_CAPABILITY can change the kernels run
        found.append(f"capability {torch.backends.cpu.get_cpu_capability()}")
    return "; ".join(found) or None


def _loaded_cublas_version() -> str | None:
    """``cublasGetProperty`` of the libcublas mapped into this process (Linux), e.g. ``"12.8.4"``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "/libcublas.so" in line or "/libcublas64" in line})
    for path in paths:
        try:
            library = ctypes.CDLL(path)
            parts = []
            for which in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                value = ctypes.c_int()
                if library.cublasGetProperty(which, ctypes.byref(value)) != 0:
                    break
                parts.append(str(value.value))
        except (OSError, AttributeError):
            continue
        if len(parts) == 3:
            return ".".join(parts)
    return None


def _cublas_version(torch, index: int | None) -> str | None:
    """The cuBLAS this process uses: the loaded library's own version where it can be read, else the
    version of the pip package that ships it, else None."""
    with contextlib.suppress(RuntimeError, AttributeError):
        with torch.cuda.device(index or 0):
            torch.cuda.current_blas_handle()  # loads libcublas, as the first GEMM would
    version = _loaded_cublas_version()
    if version:
        return version
    for package in _CUBLAS_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(package)
    return None


def environment_key(device: str, dtype_name: str) -> dict[str, str | None]:
    """The key a verification on ``device`` at ``dtype_name`` is filed under in this process.

    ``device`` must already be validated (`h3director.dit.kernels.resolve_device`); for CUDA this
    creates a cuBLAS handle on it (what the first GEMM would do anyway)."""
    import torch

    kind, index = parse_device(device)
    key: dict[str, str | None] = dict.fromkeys(KEY_FIELDS)
    key.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None),
               dtype=dtype_name)
    if kind == "cuda":
        key["device_name"] = torch.cuda.get_device_name(index or 0)
        key["cublas"] = _cublas_version(torch, index)
    elif kind == "mps":
        key["device_name"] = f"mps: {platform.processor() or platform.machine()}"
    else:
        key["device_name"] = f"cpu: {_cpu_model()}"
        key["cpu_libraries"] = _cpu_libraries(torch)
        key["threads"] = str(torch.get_num_threads())
    return key


@dataclass
class CacheRead:
    """What `read_cache` found: the valid entries, or the reason none of the file can be trusted."""

    path: Path
    entries: list[dict[str, Any]]
    problem: str | None = None  # None: absent (no entries) or valid

    @property
    def exists(self) -> bool:
        return self.path.exists()


def _check_entry(entry: Any, where: str) -> str | None:
    if not isinstance(entry, dict):
        return f"{where} is not an object"
    key = entry.get("key")
    if not isinstance(key, dict) or set(key) != set(KEY_FIELDS):
        return f"{where}.key must hold exactly {list(KEY_FIELDS)}"
    if any(value is not None and not isinstance(value, str) for value in key.values()):
        return f"{where}.key values must be strings or null"
    widths = entry.get("widths")
    if not isinstance(widths, dict) or not widths or any(
            not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in widths.values()):
        return f"{where}.widths must map names to positive integers"
    rows = entry.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        return f"{where}.rows must be a positive integer"
    for field in ("verified", "failed"):
        names = entry.get(field)
        if not isinstance(names, list) or any(name not in KERNEL_PROPERTIES for name in names):
            return f"{where}.{field} must list kernel properties from {list(KERNEL_PROPERTIES)}"
    if set(entry["verified"]) & set(entry["failed"]):
        return f"{where} lists a property as both verified and failed"
    return None


def read_cache(path: str | os.PathLike | None = None) -> CacheRead:
    """Read and validate the cache file. Absent: no entries, no problem. Too large, unreadable, not
    JSON or not the documented shape: no entries, and `problem` says why (nothing in it is trusted)."""
    final = Path(path).expanduser() if path is not None else default_cache_path()
    try:
        size = final.stat().st_size
    except FileNotFoundError:
        return CacheRead(final, [])
    except OSError as exc:
        return CacheRead(final, [], f"cannot read kernel cache {str(final)!r}: {exc}")
    if size > MAX_CACHE_BYTES:
        return CacheRead(final, [], f"kernel cache {str(final)!r} is {size} bytes, over the {MAX_CACHE_BYTES}-byte "
                                    "limit: not read")
    try:
        with open(final, "rb") as handle:
            raw = handle.read(MAX_CACHE_BYTES + 1)
        document = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return CacheRead(final, [], f"kernel cache {str(final)!r} is not valid JSON: {exc}")
    if len(raw) > MAX_CACHE_BYTES:
        return CacheRead(final, [], f"kernel cache {str(final)!r} grew over the {MAX_CACHE_BYTES}-byte limit")
    if not isinstance(document, dict) or document.get("format") != CACHE_FORMAT:
        return CacheRead(final, [], f"kernel cache {str(final)!r} is not an {CACHE_FORMAT!r} file")
    if document.get("version") != CACHE_VERSION:
        return CacheRead(final, [], f"kernel cache {str(final)!r} has version {document.get('version')!r}, "
                                    f"expected {CACHE_VERSION}")
    entries = document.get("entries")
    if not isinstance(entries, list):
        return CacheRead(final, [], f"kernel cache {str(final)!r}: 'entries' must be a list")
    for i, entry in enumerate(entries):
        problem = _check_entry(entry, f"entries[{i}]")
        if problem:
            return CacheRead(final, [], f"kernel cache {str(final)!r}: {problem}")
    return CacheRead(final, entries)


def row_class(rows: int) -> tuple[int, int]:
    """The band of packed row counts a verification at `rows` stands for: ``[2**(k-1), 2**k - 1]`` with
    ``k = rows.bit_length()`` (1,024 -> 1,024..2,047; 38,000 -> 32,768..65,535)."""
    k = int(rows).bit_length()
    return 1 << (k - 1), (1 << k) - 1


def find_entry(entries: list[dict[str, Any]], key: dict[str, Any], widths: dict[str, int],
               rows: int | None = None) -> dict[str, Any] | None:
    """The entry filed under exactly ``key`` at exactly ``widths`` for the row class of ``rows`` (None:
    the first such entry of any row class), or None."""
    for entry in entries:
        if entry["key"] == key and entry["widths"] == widths and (
                rows is None or row_class(entry["rows"]) == row_class(rows)):
            return entry
    return None


def write_entry(entry: dict[str, Any], path: str | os.PathLike | None = None) -> CacheRead:
    """File ``entry`` (replacing one with the same key, widths and row class), newest first, atomically.

    Returns what was read before writing: its `problem` says when an unreadable file was replaced."""
    problem = _check_entry(entry, "new entry")
    if problem:
        raise ValueError(problem)
    before = read_cache(path)
    kept = [e for e in before.entries if not (e["key"] == entry["key"] and e["widths"] == entry["widths"]
                                              and row_class(e["rows"]) == row_class(entry["rows"]))]
    document = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "entries": [entry, *kept][:MAX_ENTRIES]}
    with atomic_path(before.path) as temporary:
        temporary.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return before


__all__ = ["KEY_FIELDS", "MAX_CACHE_BYTES", "CacheRead", "default_cache_path", "environment_key",
           "find_entry", "read_cache", "row_class", "write_entry"]
