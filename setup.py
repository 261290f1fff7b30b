"""Build hook: compiles h3director/native/h3_core.c into the package (pyproject.toml holds the metadata).

The library is a plain C shared object loaded with ctypes (it defines no Python module), built
with the flags in h3director/native/build.py. When no C compiler is available the install still
succeeds and H3 Director uses its numpy fallback (`h3director doctor` shows which is active).
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_BUILD_PY = Path(__file__).resolve().parent / "h3director" / "native" / "build.py"
_spec = importlib.util.spec_from_file_location("_h3director_native_build", _BUILD_PY)
native_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native_build)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the package works (slower) without the library."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any compiler/linker failure means "use the fallback"
            self.warn(f"could not build {ext.name} ({exc}); h3director.native will use its numpy fallback")

    def get_export_symbols(self, ext):
        return []  # a ctypes library, not a Python module: there is no PyInit_ symbol to export


setup(
    ext_modules=[
        Extension(
            "h3director.native." + native_build.LIBRARY_STEM,
            sources=["h3director/native/h3_core.c"],
            extra_compile_args=native_build.COMPILE_ARGS,
            extra_link_args=native_build.LINK_ARGS,
            libraries=native_build.LIBRARIES,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
