"""`h3director upscale` recipe options with real spandrel models (random-init RealESRGAN Compact x1/x2, ESRGAN x4,
DnCNN), run in the ComfyUI environment (spandrel needs torchvision): pre-resize -> restore -> Lanczos post-resize
equals the same steps by hand, fp16 against fp32 with the measured difference, tile batch against one tile at a
time, and bad input refused before any output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from comfy_harness.server import comfyui_python
from test_upscale_spandrel import _batch, _run

from h3director.video.resize import resize_frame

pytestmark = pytest.mark.skipif(
    not os.environ.get("COMFYUI_PYTHON") or not Path(comfyui_python()).is_file(),
    reason="needs the ComfyUI environment with spandrel (COMFYUI_PYTHON; bash scripts/setup.sh)")
HARNESS = Path(__file__).resolve().parents[1] / "fixtures" / "comfy_harness"
F, H, W = 2, 72, 128


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("recipe-models")
    _run(str(HARNESS / "upscale_models.py"), "write", str(folder))
    return folder


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict:
    """Every CLI run and reference of the module in one ComfyUI-environment process."""
    folder = tmp_path_factory.mktemp("recipe-runs")
    frames = np.random.default_rng(3).integers(0, 256, (F, H, W, 3), dtype=np.uint8)
    np.save(folder / "in.npy", frames)
    small = torch.stack([resize_frame(torch.from_numpy(f).permute(2, 0, 1).float() / 255, (36, 64), "area")
                         for f in frames]).permute(0, 2, 3, 1).contiguous().numpy()
    np.save(folder / "small.npy", small)

    def cli(name: str, model: str, *extra: str) -> list[str]:
        return ["cli", "upscale", str(folder / "in.npy"), "--model", str(models / model), "--out",
                str(folder / f"{name}.npy"), "--json", *extra]

    cases = {
        "recipe": cli("recipe", "compact_x1.safetensors", "--pre-resize", "64x36", "--post-resize", "128x72",
                      "--tile", "24"),
        "small-ref": ["reference", str(models / "compact_x1.safetensors"), str(folder / "small.npy"),
                      str(folder / "small-ref.npy")],
        "fp32": cli("fp32", "compact_x2.safetensors", "--tile", "48"),
        "fp16": cli("fp16", "compact_x2.safetensors", "--tile", "48", "--dtype", "fp16"),
        "bf16": cli("bf16", "compact_x2.safetensors", "--tile", "48", "--dtype", "bf16"),
        "batch1": cli("batch1", "esrgan_x4.safetensors", "--tile", "80"),
        "batch4": cli("batch4", "esrgan_x4.safetensors", "--tile", "80", "--tile-batch", "4"),
    }
    results = dict(zip(cases, _batch(list(cases.values()), folder), strict=True))
    for name, result in results.items():
        assert result["rc"] == 0, (name, result)
    return {"folder": folder, "results": results,
            "reports": {k: json.loads(v["stdout"]) for k, v in results.items() if k in cases and v["stdout"]}}


def test_pre_resize_restore_post_resize_equals_the_steps_by_hand(runs):
    folder, report = runs["folder"], runs["reports"]["recipe"]
    assert report["model_size"] == [36, 64] and report["output_size"] == [H, W] and report["exact"]
    assert report["tiles_per_frame"] > 1
    assert [s["name"] for s in report["stages"]] == ["read", "pre-resize", "model", "post-resize", "write"]
    assert all(s["frames"] == F and s["peak_host_bytes"] > 0 for s in report["stages"])
    restored = torch.from_numpy(np.load(folder / "small-ref.npy")).permute(0, 3, 1, 2)
    expected = torch.stack([resize_frame(f, (H, W), "lanczos") for f in restored]).permute(0, 2, 3, 1).numpy()
    got = np.load(folder / "recipe.npy")
    assert got.shape == (F, H, W, 3) and got.dtype == np.uint8
    # tiles exact up to float rounding, the same deterministic resizes: within one uint8 step
    assert np.abs(got.astype(np.int32) - np.round(expected * 255).astype(np.int32)).max() <= 1


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_lower_precision_reports_its_difference_from_fp32(runs, dtype):
    report = runs["reports"][dtype]
    error = report["dtype_error"]
    assert report["dtype"] == dtype and runs["reports"]["fp32"]["dtype_error"] is None
    assert 0 < error["mean_abs"] <= error["max_abs"] < (1e-2 if dtype == "fp16" else 5e-2)
    full = np.load(runs["folder"] / "fp32.npy").astype(np.int32)
    low = np.load(runs["folder"] / f"{dtype}.npy").astype(np.int32)
    assert 0 < np.abs(full - low).max() <= (3 if dtype == "fp16" else 12)


def test_tile_batch_equals_one_tile_at_a_time(runs):
    one, many = runs["reports"]["batch1"], runs["reports"]["batch4"]
    assert one["tiles"] == many["tiles"] and one["tiles_per_frame"] >= 4 and many["tile_batch_used"] == 4
    a = np.load(runs["folder"] / "batch1.npy").astype(np.int32)
    b = np.load(runs["folder"] / "batch4.npy").astype(np.int32)
    assert np.abs(a - b).max() <= 1


def test_bad_recipe_input_is_refused_before_any_output(models, tmp_path):
    frames = tmp_path / "in.npy"
    np.save(frames, np.zeros((1, 16, 16, 3), np.uint8))
    out = str(tmp_path / "out.npy")
    compact = str(models / "compact_x2.safetensors")
    cases = [
        (["--pre-resize", "0x36"], "positive and even"),
        (["--post-resize", "127x72"], "positive and even"),
        (["--post-resize", "128x72", "--resample", "sinc"], "'sinc' is not a resampling filter"),
        (["--resample", "lanczos"], "--resample applies to --post-resize"),
        (["--tile-batch", "0"], "--tile-batch must be"),
        (["--dtype", "fp8"], "dtype 'fp8' is not one of"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--dtype", "fp16", "--device", "cuda"], "--dtype fp16: cuda is not available"))
    argv = [["cli", "upscale", str(frames), "--model", compact, "--out", out, *extra] for extra, _ in cases]
    argv.append(["cli", "upscale", str(frames), "--model", str(models / "dncnn_rgb.safetensors"), "--out", out,
                 "--dtype", "fp16"])
    messages = [message for _, message in cases] + ["spandrel marks DnCNN as not supporting fp16"]
    results = _batch(argv, tmp_path)
    for args, message, result in zip(argv, messages, results, strict=True):
        assert result["rc"] == 2 and message in result["stderr"], (args, result)
        assert len(result["stderr"].strip().splitlines()) == 1, result["stderr"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.json", "in.npy"]
