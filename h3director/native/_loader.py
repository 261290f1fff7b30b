"""Find, load and check the compiled h3_core library (ctypes); build it on first use where it is missing.

Search order: the path in $H3_NATIVE_LIB (used by the sanitizer test build; when set, nothing else is
tried), then ``_h3_core<ext-suffix>`` (and any other ``_h3_core*.so``) next to this file (what `pip install`
builds), then the per-user cache of `build.cached_library_path()`. When none loads and a C compiler exists,
the library is built into that cache once (`build.build_cached`: a few seconds, atomic, shared by every
process and clone of the same source) and loaded. The library must report ``h3_abi_version() ==
ABI_VERSION``; otherwise the numpy fallback is used and one warning line says why (unless $H3_NATIVE=c,
which turns that into an error). `status()` says which backend is in use, from where, and why.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from h3director.errors import InvalidInputError

ABI_VERSION = 1
LIBRARY_ENV = "H3_NATIVE_LIB"

_log = logging.getLogger("h3director.native")
_lock = threading.Lock()
_loaded: tuple[ModuleType | None, str] | None = None  # (the C backend module or None, where it is / why not)
_built_now = False  # this process compiled the library it loaded (first use)

_i64, _u64, _int, _ptr = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "h3_abi_version": (ctypes.c_uint32, []),
    "h3_strerror": (ctypes.c_char_p, [_int]),
    "h3_pack_frames": (_int, [_ptr, _int, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64,
                              _ptr, _ptr, _i64, _ptr, _i64, _int]),
    "h3_quant_block_size": (_int, [_int, ctypes.POINTER(_i64), ctypes.POINTER(_i64)]),
    "h3_dequantize": (_int, [_int, _ptr, _i64, _ptr, _int, _i64, _int]),
    "h3_arena_create": (_ptr, [_u64, _u64, _u64]),
    "h3_arena_destroy": (None, [_ptr]),
    "h3_arena_base": (_ptr, [_ptr]),
    "h3_arena_alloc": (_int, [_ptr, _u64, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    "h3_arena_free": (_int, [_ptr, _u64]),
    "h3_arena_stats": (_int, [_ptr, _ptr, _i64]),
    "h3_arena_stats_size": (_i64, []),
}


def candidates() -> list[Path]:
    """Library paths to try, in order."""
    from h3director.native import build

    here = Path(__file__).resolve().parent
    paths = []
    if os.environ.get(LIBRARY_ENV):
        paths.append(Path(os.environ[LIBRARY_ENV]))
        return paths
    paths.append(here / build.library_filename())
    paths.extend(sorted(p for p in here.glob(build.LIBRARY_STEM + "*.so") if p not in paths))
    paths.append(build.cached_library_path())
    return paths


def open_library(path: Path) -> ctypes.CDLL:
    """Load one library and declare its functions; raises OSError when it is not a usable h3_core."""
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)  # AttributeError -> not our library
        fn.restype = restype
        fn.argtypes = argtypes
    version = lib.h3_abi_version()
    if version != ABI_VERSION:
        raise OSError(f"{path} has ABI version {version}, this package needs {ABI_VERSION}")
    return lib


def _find() -> tuple[ctypes.CDLL | None, str]:
    global _built_now
    reasons = []
    for path in candidates():
        if not path.exists():
            continue
        try:
            return open_library(path), str(path)
        except (OSError, AttributeError) as exc:
            reasons.append(str(exc))
    if os.environ.get(LIBRARY_ENV):
        return None, "; ".join(reasons) or f"${LIBRARY_ENV} {os.environ[LIBRARY_ENV]} not found"
    from h3director.native import build

    try:
        path = build.build_cached()
        lib = open_library(path)
    except (OSError, AttributeError) as exc:
        reasons.append(str(exc))
        return None, "; ".join(reasons)
    _built_now = True
    _log.info("h3director.native: built %s on first use", path)
    return lib, str(path)


def c_backend(required: bool = False) -> ModuleType | None:
    """The C backend module (h3director.native._c) bound to the library, or None (logged once)."""
    global _loaded
    with _lock:
        if _loaded is None:
            lib, where = _find()
            if lib is None:
                _log.warning(
                    "h3director.native: C library unavailable (%s); using the numpy fallback "
                    "(same bytes, slower; `h3director doctor` shows the measured cost)", where)
                _loaded = (None, where)
            else:
                from h3director.native import _c

                _c.bind(lib, where)
                _loaded = (_c, where)
    module, why = _loaded
    if module is None and required:
        raise ImportError(f"H3_NATIVE=c but the h3_core library is unavailable: {why}")
    return module


@dataclass(frozen=True)
class LoadStatus:
    """What the loader found: `backend` "c" or "numpy"; `library` the loaded file (None for numpy);
    `built_now` whether this process compiled it on first use; `reason` why the fallback is used ("" for C)."""

    backend: str
    library: str | None
    built_now: bool
    reason: str


def status() -> LoadStatus:
    """The loader's state, loading (and on first use building) the library if that was not tried yet."""
    module = c_backend()
    if module is None:
        return LoadStatus("numpy", None, False, _loaded[1] if _loaded else "not loaded")
    return LoadStatus("c", str(module.LIBRARY_PATH), _built_now, "")


def describe() -> str:
    """One line for `h3director doctor`: which backend is active and where its library is."""
    state = status()
    if state.backend == "numpy":
        return f"numpy fallback ({state.reason})"
    return f"c ({state.library}, ABI {ABI_VERSION}{', built on first use' if state.built_now else ''})"


BACKEND_ENV = "H3_NATIVE"  # "numpy" forces the fallback, "c" makes a missing library an error


def implementation(name: str | None = None) -> ModuleType:
    """The backend module for `name` ("c", "numpy", or None for the active one). `InvalidInputError` for
    any other name, also from ``H3_NATIVE``."""
    wanted = name or os.environ.get(BACKEND_ENV, "").strip().lower() or None
    if wanted not in (None, "c", "numpy"):
        raise InvalidInputError(f"backend must be 'c' or 'numpy', got {wanted!r}")
    if wanted != "numpy":
        module = c_backend(required=wanted == "c")
        if module is not None:
            return module
    from h3director.native import _fallback

    return _fallback
