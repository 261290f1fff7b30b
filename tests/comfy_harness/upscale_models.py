"""Tiny random-init spandrel upscalers and their untiled outputs, for the upscale tests and benches.

Runs in the ComfyUI environment (spandrel needs torchvision), as a script:

    python upscale_models.py write FOLDER          writes the models in `MODELS` (and two files that are no upscaler)
    python upscale_models.py reference MODEL IN.npy OUT.npy
                                                   the untiled float32 output [F, H*s, W*s, 3] of MODEL on IN
                                                   (uint8, or float32 in [0, 1])
    python upscale_models.py batch CASES.json      runs each case in one process (spandrel imported once) and
                                                   prints a JSON list of {"rc", "stdout", "stderr"}; a case is
                                                   ["cli", ARG, ...] (`h3director` arguments) or ["reference", ...]

or imported (`build(name)` returns the torch module of one config).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

MODELS = {
    # name: (architecture, constructor arguments, file suffix)
    "esrgan_x4": ("ESRGAN", dict(in_nc=3, out_nc=3, num_filters=8, num_blocks=2, scale=4), ".safetensors"),
    "esrgan_x2_unshuffle": ("ESRGAN", dict(in_nc=12, out_nc=3, num_filters=8, num_blocks=1, scale=4,
                                           shuffle_factor=2), ".pth"),
    "compact_x2": ("Compact", dict(num_in_ch=3, num_out_ch=3, num_feat=16, num_conv=6, upscale=2), ".safetensors"),
    "plksr_x2": ("PLKSR", dict(dim=16, n_blocks=2, upscaling_factor=2, kernel_size=9, split_ratio=0.25),
                 ".safetensors"),
    "realplksr_x2": ("RealPLKSR", dict(dim=16, n_blocks=2, upscaling_factor=2, kernel_size=9, split_ratio=0.25),
                     ".safetensors"),
    "compact_gray_x2": ("Compact", dict(num_in_ch=1, num_out_ch=1, num_feat=8, num_conv=2, upscale=2), ".pth"),
    # 1x restoration models: a RealESRGAN Compact at scale 1, and a DnCNN (spandrel: supports_half=False)
    "compact_x1": ("Compact", dict(num_in_ch=3, num_out_ch=3, num_feat=16, num_conv=4, upscale=1), ".safetensors"),
    "dncnn_rgb": ("DnCNN", dict(in_nc=3, out_nc=3, nc=8, nb=8, act_mode="R"), ".safetensors"),
}
NOT_UPSCALERS = ("compact_gray_x2",)


def build(name: str, seed: int = 0) -> torch.nn.Module:
    from spandrel.architectures.Compact import Compact
    from spandrel.architectures.DnCNN import DnCNN
    from spandrel.architectures.ESRGAN import ESRGAN
    from spandrel.architectures.PLKSR import PLKSR, RealPLKSR

    arch, kwargs, _ = MODELS[name]
    torch.manual_seed(seed)
    classes = {"ESRGAN": ESRGAN, "Compact": Compact, "PLKSR": PLKSR, "RealPLKSR": RealPLKSR, "DnCNN": DnCNN}
    return classes[arch](**kwargs).eval()


def write(folder: Path) -> None:
    import safetensors.torch

    folder.mkdir(parents=True, exist_ok=True)
    for name, (_, _, suffix) in MODELS.items():
        state = {k: v.contiguous() for k, v in build(name).state_dict().items()}
        path = folder / f"{name}{suffix}"
        if suffix == ".safetensors":
            safetensors.torch.save_file(state, str(path))
        else:
            torch.save(state, str(path))
    safetensors.torch.save_file({"weight": torch.zeros(4, 4)}, str(folder / "unknown_arch.safetensors"))


def reference(model_path: str, frames_path: str, out_path: str) -> None:
    import spandrel

    descriptor = spandrel.ModelLoader().load_from_file(model_path).eval()
    frames = np.load(frames_path, mmap_mode="r")
    outputs = []
    with torch.inference_mode():
        for frame in frames:
            image = torch.from_numpy(np.array(frame)).permute(2, 0, 1)[None].float()
            image = image / 255 if frame.dtype == np.uint8 else image  # float32 frames are in [0, 1] already
            outputs.append(descriptor(image)[0].permute(1, 2, 0).numpy())
    np.save(out_path, np.stack(outputs).astype(np.float32))


def batch(cases_path: str) -> None:
    import contextlib
    import io
    import json

    from h3director.cli import main

    results = []
    for case in json.loads(Path(cases_path).read_text()):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(case[1:]) if case[0] == "cli" else reference(*case[1:]) or 0
        results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
    print(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1] == "batch":
        batch(sys.argv[2])
    elif sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif sys.argv[1] == "reference":
        reference(*sys.argv[2:5])
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
