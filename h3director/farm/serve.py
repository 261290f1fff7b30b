"""Run ComfyUI's ``main.py`` so that it exits when the process that started it dies.

``python -m h3director.farm.serve PARENT_PID COMFYUI_DIR [main.py arguments...]`` (standard library
only: it runs in ComfyUI's own Python). A thread polls the parent PID once a second; when the parent
is gone (a worker killed by Ray, or a killed driver taking its Ray with it), the server exits at once,
so no orphaned server keeps a device's memory. Then ``main.py`` runs in this process as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time


def _watch(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)


def main(argv: list[str]) -> None:
    """`argv` = [PARENT_PID, COMFYUI_DIR, main.py arguments...]: run ComfyUI's main.py here, exiting (status 3)
    as soon as the parent process is gone. Returns when main.py returns."""
    parent, root, *args = argv
    threading.Thread(target=_watch, args=(int(parent),), daemon=True, name="h3farm-parent-watch").start()
    os.chdir(root)
    sys.path.insert(0, root)
    sys.argv = [os.path.join(root, "main.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["main"]
