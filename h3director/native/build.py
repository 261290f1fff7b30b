"""Compile h3_core.c into the shared library the ctypes loader looks for.

The package build (setup.py) uses these flags through setuptools and puts the library next to h3_core.c.
A checkout used without pip (for example cloned into ComfyUI/custom_nodes/) gets it on first use instead:
the loader calls `build_cached()`, which compiles into a per-user cache (never into the source tree, which
may be read-only), keyed by the hash of the source and flags and by the platform, so every clone of the same
source shares one build and an edited source gets a new one:

    ${H3_NATIVE_CACHE:-${XDG_CACHE_HOME:-~/.cache}/h3director/native}/<platform>-<hash>/_h3_core.so
    (Windows: %LOCALAPPDATA%\\h3director\\native\\...)

By hand:

    python -m h3director.native.build            # builds into that cache (what first use does)
    python -m h3director.native.build --output h3director/native/_h3_core.so     # anywhere else
    python -m h3director.native.build --sanitize --output /tmp/h3_core_asan.so    # ASan + UBSan test build

Flags: -O3 with vectorisable loops; -ffp-contract=off because fusing a multiply and an add into
one FMA would change rounding and break byte-identity with the PyTorch and numpy references;
-fno-trapping-math (no FP exception flags are observed) so the clamps vectorise as selects;
-fno-math-errno. No -ffast-math: it would change results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("h3_core.c")
LIBRARY_STEM = "_h3_core"
COMPILE_ARGS = [
    "-std=c11", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-pthread", "-Wall", "-Wextra",
]
LINK_ARGS = ["-pthread"]
LIBRARIES = ["m"]
SANITIZE_ARGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined", "-g"]
CACHE_ENV = "H3_NATIVE_CACHE"


class NoCompilerError(OSError):
    """No C compiler to build the library with ($CC names a missing program, or none is on PATH)."""


def library_filename() -> str:
    """`_h3_core` plus this interpreter's extension suffix, the name setuptools gives the library."""
    return LIBRARY_STEM + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compiler() -> list[str]:
    """The C compiler: $CC, else the one Python was built with, else `cc`."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)[:1]


def find_compiler() -> str:
    """The full path of `compiler()`, or `NoCompilerError` saying what was looked for (a set $CC is never
    second-guessed: CC naming a missing program means no compiler)."""
    name = compiler()[0] if compiler() else "cc"
    found = shutil.which(name)
    if found is None:
        where = f"$CC={os.environ['CC']!r} not found" if os.environ.get("CC") else f"{name!r} not on PATH"
        raise NoCompilerError(f"no C compiler ({where})")
    return found


def cache_dir() -> Path:
    """The per-user folder of built libraries: $H3_NATIVE_CACHE, else the platform's user cache + h3director/native."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "h3director" / "native"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "h3director" / "native"


def source_key() -> str:
    """16 hex digits of SHA-256 over h3_core.c and the build flags: a new source or new flags, a new build."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(json.dumps([COMPILE_ARGS, LINK_ARGS, LIBRARIES]).encode())
    return digest.hexdigest()[:16]


def cached_library_path() -> Path:
    """Where `build_cached` puts (and the loader looks for) the library of this source on this platform."""
    platform_tag = re.sub(r"[^A-Za-z0-9_.-]", "_", sysconfig.get_platform())
    suffix = ".dll" if sys.platform == "win32" else ".so"
    return cache_dir() / f"{platform_tag}-{source_key()}" / (LIBRARY_STEM + suffix)


def build_cached() -> Path:
    """Build the library into `cached_library_path()` unless it is there; return its path.

    Safe under concurrency: each process compiles to its own temporary name in the same folder and renames
    it into place (a reader sees no file or a whole one). Raises `NoCompilerError` without a compiler and
    `OSError` (with the compiler's last output lines) when the build fails."""
    target = cached_library_path()
    if target.is_file():
        return target
    find_compiler()
    try:
        build(target, capture=True)
    except subprocess.CalledProcessError as exc:
        tail = " ".join((exc.stderr or "").strip().splitlines()[-3:])
        raise OSError(f"building {SOURCE.name} with {compiler()[0]} failed (exit {exc.returncode}): {tail}") from None
    return target


def build(output: Path | None = None, *, sanitize: bool = False, capture: bool = False) -> Path:
    """Compile the library to `output` (default: `cached_library_path()`); written atomically (temporary name in
    the same folder, then rename). `capture`: keep the compiler's output (in the CalledProcessError) instead of
    printing it. Returns the path."""
    output = Path(output) if output else cached_library_path()
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=output.name + ".", suffix=".tmp", dir=output.parent)
    os.close(fd)
    flags = COMPILE_ARGS + (SANITIZE_ARGS if sanitize else [])
    cmd = [*compiler(), *flags, "-fPIC", "-shared", "-o", tmp, str(SOURCE), *LINK_ARGS]
    cmd += [f"-l{lib}" for lib in LIBRARIES]
    try:
        subprocess.run(cmd, check=True, capture_output=capture, text=capture)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return output


def main(argv: list[str] | None = None) -> int:
    """`python -m h3director.native.build [--output PATH] [--sanitize]`: build the library and print its path;
    returns 0, or 1 when the compiler fails (message on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m h3director.native.build", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="where to write the library (default: the per-user cache the "
                                                    "loader reads, see above)")
    parser.add_argument("--sanitize", action="store_true", help="AddressSanitizer + UBSan test build")
    args = parser.parse_args(argv)
    try:
        path = build(args.output, sanitize=args.sanitize)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"building {SOURCE.name} failed: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["LIBRARY_STEM", "SOURCE", "NoCompilerError", "build", "build_cached", "cached_library_path",
           "compiler", "library_filename", "main", "source_key"]
