"""`h3director upscale` with real spandrel models (random-init ESRGAN/RRDB and RealESRGAN Compact), run as a
subprocess in the ComfyUI environment (spandrel needs torchvision, which .venv's torch lacks): tiled output equals
the untiled upscale, bad models and arguments are refused before any output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from comfy_harness.server import HARNESS, REPO, comfyui_python

PYTHON = comfyui_python()
pytestmark = pytest.mark.skipif(
    not os.environ.get("COMFYUI_PYTHON") or not Path(PYTHON).is_file(),
    reason="needs the ComfyUI environment with spandrel (COMFYUI_PYTHON; bash scripts/setup.sh)")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([PYTHON, *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="2"))
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("-m", "h3director", "upscale", *args, check=check)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("upscale-models")
    _run(str(HARNESS / "upscale_models.py"), "write", str(folder))
    return folder


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("upscale-in") / "in.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, (3, 62, 130, 3), dtype=np.uint8))
    return path


CASES = [("esrgan_x4.safetensors", 80), ("esrgan_x2_unshuffle.pth", 110), ("compact_x2.safetensors", 40),
         ("plksr_x2.safetensors", 48)]


def _batch(cases: list[list[str]], folder: Path) -> list[dict]:
    """Run `cases` (see upscale_models.batch) in one ComfyUI-environment process."""
    path = folder / "cases.json"
    path.write_text(json.dumps(cases))
    return json.loads(_run(str(HARNESS / "upscale_models.py"), "batch", str(path)).stdout)


@pytest.fixture(scope="module")
def runs(models, frames, tmp_path_factory) -> dict:
    """Every model through the CLI with auto overlap and with overlap 0, and its untiled reference, in one process."""
    folder = tmp_path_factory.mktemp("upscale-runs")
    cases, keys = [], []
    for name, tile in CASES:
        for kind, extra in (("auto", ["--json"]), ("seams", ["--overlap", "0"])):
            cases.append(["cli", "upscale", str(frames), "--model", str(models / name), "--out",
                          str(folder / f"{name}.{kind}.npy"), "--tile", str(tile), *extra])
            keys.append((name, kind))
        cases.append(["reference", str(models / name), str(frames), str(folder / f"{name}.ref.npy")])
        keys.append((name, "reference"))
    cases.append(["cli", "upscale", str(frames), "--model", str(models / "realplksr_x2.safetensors"), "--out",
                  str(folder / "realplksr.npy"), "--tile", "48", "--json"])
    keys.append(("realplksr_x2.safetensors", "auto"))
    results = dict(zip(keys, _batch(cases, folder), strict=True))
    return {"folder": folder, "results": results}


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_cli_tiled_equals_untiled(runs, name):
    folder, results = runs["folder"], runs["results"]
    for kind in ("auto", "seams", "reference"):
        assert results[(name, kind)]["rc"] == 0, results[(name, kind)]
    report = json.loads(results[(name, "auto")]["stdout"])
    assert report["exact"] and report["overlap_source"] == "derived"
    assert report["tiles_per_frame"] > 1, "the tile must cut the frame for the test to mean anything"
    expected = np.round(np.load(folder / f"{name}.ref.npy") * 255).astype(np.int32)
    got = np.load(folder / f"{name}.auto.npy")
    assert got.shape == expected.shape and got.dtype == np.uint8
    # uint8 of the untiled float output, within one step (rounding of values that differ by float error)
    assert np.abs(got.astype(np.int32) - expected).max() <= 1
    # and the seams show without the overlap
    assert np.abs(np.load(folder / f"{name}.seams.npy").astype(np.int32) - expected).max() > 1


def test_cli_groupnorm_model_is_feathered_and_reported_not_exact(runs):
    result = runs["results"][("realplksr_x2.safetensors", "auto")]
    assert result["rc"] == 0, result
    report = json.loads(result["stdout"])
    assert not report["exact"] and report["receptive_field"] is None
    assert report["overlap_source"].startswith("feather") and report["overlap"] == 48 // 8
    assert np.load(runs["folder"] / "realplksr.npy").shape == (3, 124, 260, 3)


def test_cli_refuses_bad_input_before_output(models, frames, tmp_path):
    out = tmp_path / "out.npy"
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((2, 8, 8, 4), np.uint8))
    existing = tmp_path / "exists.npy"
    existing.write_bytes(b"keep")
    compact = str(models / "compact_x2.safetensors")
    cases = [
        ([str(frames), "--model", str(models / "compact_gray_x2.pth"), "--out", str(out)], "not an RGB upscaler"),
        ([str(frames), "--model", str(models / "unknown_arch.safetensors"), "--out", str(out)],
         "not a model architecture spandrel knows"),
        ([str(frames), "--model", str(models / "esrgan_x4.safetensors"), "--tile", "40", "--out", str(out)],
         "larger than 2 x overlap"),
        ([str(frames), "--model", compact, "--overlap", "wide", "--out", str(out)], "--overlap must be"),
        ([str(frames), "--model", str(tmp_path / "missing.pth"), "--out", str(out)], "no such model file"),
        ([str(frames), "--model", compact, "--out", str(tmp_path / "o.gif")], "--out"),
        ([str(wrong), "--model", compact, "--out", str(out)], "[F, H, W, 3]"),
        ([str(tmp_path / "nothing.mp4"), "--model", compact, "--out", str(out)], "no such file"),
        ([str(frames), "--model", compact, "--out", str(existing)], "--resume"),
    ]
    results = _batch([["cli", "upscale", *argv] for argv, _ in cases], tmp_path)
    for (argv, message), result in zip(cases, results, strict=True):
        assert result["rc"] == 2 and message in result["stderr"], (argv, result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.json", "exists.npy", "wrong.npy"]
    assert existing.read_bytes() == b"keep"
