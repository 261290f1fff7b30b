"""Compile h3_core.c into the shared library the ctypes loader looks for.

The package build (setup.py) uses these flags through setuptools; this module also builds on
demand for a checkout used without pip (for example cloned into ComfyUI/custom_nodes/):

    python -m h3director.native.build            # writes h3director/native/_h3_core<suffix>
    python -m h3director.native.build --sanitize --output /tmp/h3_core_asan.so    # ASan + UBSan test build

Flags: -O3 with vectorisable loops; -ffp-contract=off because fusing a multiply and an add into
one FMA would change rounding and break byte-identity with the PyTorch and numpy references;
-fno-trapping-math (no FP exception flags are observed) so the clamps vectorise as selects;
-fno-math-errno. No -ffast-math: it would change results.
"""

from __future__ import annotations

import argparse
import os
import shlex
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


def library_filename() -> str:
    """`_h3_core` plus this interpreter's extension suffix, the name setuptools gives the library."""
    return LIBRARY_STEM + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compiler() -> list[str]:
    """The C compiler: $CC, else the one Python was built with, else `cc`."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)[:1]


def build(output: Path | None = None, *, sanitize: bool = False) -> Path:
    """Compile the library to `output` (default: next to h3_core.c); written atomically. Returns the path."""
    output = Path(output) if output else SOURCE.with_name(library_filename())
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=output.name + ".", suffix=".tmp", dir=output.parent)
    os.close(fd)
    flags = COMPILE_ARGS + (SANITIZE_ARGS if sanitize else [])
    cmd = [*compiler(), *flags, "-fPIC", "-shared", "-o", tmp, str(SOURCE), *LINK_ARGS]
    cmd += [f"-l{lib}" for lib in LIBRARIES]
    try:
        subprocess.run(cmd, check=True)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m h3director.native.build", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="where to write the library (default: the package folder)")
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
