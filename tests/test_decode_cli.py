"""`h3director decode`: real weights from disk, stock-equal output, and refusals before any work."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from h3director.cli import main
from h3director.core.safetensors_header import SafetensorsLimits, read_header
from h3director.errors import InvalidInputError


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    """The tiny real H3 VAE saved as a diffusers pipeline folder (`vae/config.json` + safetensors)."""
    from h3director.commands.demo_vaes import tiny_h3_vae

    root = tmp_path_factory.mktemp("weights")
    tiny_h3_vae(seed=1).save_pretrained(root / "vae")
    return root


def _latents(frames=7, height=4, width=6, seed=0) -> torch.Tensor:
    return torch.randn((1, 24, frames, height, width), generator=torch.Generator().manual_seed(seed))


def _stock_frames(vae_folder, latents: torch.Tensor) -> np.ndarray:
    """diffusers' H3 decode block on `latents`: denormalize, `vae.decode`, de-normalise pixels, uint8 via PIL."""
    from diffusers import AutoencoderKLMiniMaxH3
    from diffusers.video_processor import VideoProcessor

    vae = AutoencoderKLMiniMaxH3.from_pretrained(vae_folder).eval()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(latents * std + mean, return_dict=False)[0]
    pixel_mean = torch.tensor((0.485, 0.456, 0.406)).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor((0.229, 0.224, 0.225)).view(1, -1, 1, 1, 1)
    video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
    pil = VideoProcessor(vae_scale_factor=16, do_normalize=False).postprocess_video(video, output_type="pil")
    return np.stack([np.asarray(image) for image in pil[0]])


def _decode(capsys, *argv) -> tuple[int, str, str]:
    code = main(["decode", *map(str, argv), "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_decode_to_npy_equals_stock_pipeline(vae_dir, tmp_path, capsys):
    latents = _latents(frames=12)  # off the 5n+2 grid: 39 frames, two clips cross-faded
    save_file({"latents": latents}, tmp_path / "z.safetensors")
    code, out, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", vae_dir, "--out", tmp_path / "f.npy")
    assert code == 0, err
    frames = np.load(tmp_path / "f.npy", mmap_mode="r")
    assert frames.shape == (39, 64, 96, 3)
    np.testing.assert_array_equal(frames, _stock_frames(vae_dir / "vae", latents))
    assert "39 frames, 2 clip(s)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npy", "z.safetensors"]


def test_decode_comfyui_latent_from_single_file_weights(vae_dir, tmp_path, capsys):
    latents = _latents(frames=7, seed=2)
    save_file({"latent_tensor": latents, "latent_format_version_0": torch.tensor([])}, tmp_path / "z.latent")
    weights = vae_dir / "vae" / "diffusion_pytorch_model.safetensors"  # config.json lies beside it
    code, _, err = _decode(capsys, tmp_path / "z.latent", "--vae", weights, "--out", tmp_path / "f.npy")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "f.npy"), _stock_frames(vae_dir / "vae", latents))


def test_decode_to_mp4(vae_dir, tmp_path, capsys):
    import av

    save_file({"latents": _latents(frames=7, seed=3)}, tmp_path / "z.safetensors")
    code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", vae_dir, "--out", tmp_path / "v.mp4",
                           "--crf", 23, "--fps", 12)
    assert code == 0, err
    with av.open(str(tmp_path / "v.mp4")) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height) == (96, 64) and stream.average_rate == 12
        assert sum(1 for _ in container.decode(video=0)) == 22


def test_decode_video_and_audio_to_mp4(vae_dir, tmp_path, capsys):
    import av

    from h3director.commands.demo_vaes import tiny_h3_audio_vae

    tiny_h3_audio_vae(seed=1).save_pretrained(tmp_path / "audio_vae")
    audio = torch.randn((2, 32, 37), generator=torch.Generator().manual_seed(4))  # diffusers' [S, C, Ta]
    save_file({"latents": _latents(frames=7, seed=4), "audio_latents": audio}, tmp_path / "av.safetensors")
    code, out, err = _decode(capsys, tmp_path / "av.safetensors", "--vae", vae_dir, "--audio-vae", tmp_path,
                             "--out", tmp_path / "av.mp4")
    assert code == 0, err
    assert f"{37 * 800} audio samples per channel" in out
    with av.open(str(tmp_path / "av.mp4")) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "aac" and stream.rate == 32_000 and stream.channels == 2
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - 37 * 800) <= 2048  # AAC pads to whole 1024-sample frames
    assert sum(1 for _ in av.open(str(tmp_path / "av.mp4")).decode(video=0)) == 22


# -- refusals: each happens before the VAE is loaded or anything is written --------------------------

def _write_raw(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _bad_files(tmp_path):
    good_entry = {"dtype": "F32", "shape": [1, 24, 7, 2, 2], "data_offsets": [0, 1 * 24 * 7 * 2 * 2 * 4]}
    data = bytes(good_entry["data_offsets"][1])
    many = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(20)}
    return {
        "header length beyond the file": (_write_raw(tmp_path / "a.safetensors", {}, length=10_000),
                                          "header claims 10000 bytes"),
        "oversized header": (_write_raw(tmp_path / "b.safetensors", {}, length=1 << 40),
                             "exceeds the limit of 1048576"),
        "not JSON": (_write_raw(tmp_path / "c.safetensors", b"{not json"), "not valid UTF-8 JSON"),
        "too many tensors": (_write_raw(tmp_path / "d.safetensors", many, bytes(80)), "20 tensors, more than"),
        "offsets past the data": (_write_raw(tmp_path / "e.safetensors", {"latents": good_entry}, data[:-4]),
                                  "fall outside the"),
        "size mismatch": (_write_raw(tmp_path / "f.safetensors",
                                     {"latents": {**good_entry, "shape": [1, 24, 7, 2, 1]}}, data),
                          "but its data spans"),
        "missing latents": (_write_raw(tmp_path / "g.safetensors", {"other": good_entry}, data),
                            "expected a 'latents' tensor, found \\['other'\\]"),
        "wrong rank": (_write_raw(tmp_path / "h.safetensors",
                                  {"latents": {**good_entry, "shape": [24, 7, 2, 2]}}, data),
                       "must have rank 5"),
        "integer latents": (_write_raw(tmp_path / "i.safetensors", {"latents": {**good_entry, "dtype": "I32"}}, data),
                            "must be floating point"),
        "bad extension": (_write_raw(tmp_path / "j.pt", {"latents": good_entry}, data),
                          "must be a .safetensors or a ComfyUI .latent file"),
        "legacy comfy latent": (_write_raw(tmp_path / "k.latent", {"latent_tensor": good_entry}, data),
                                "legacy latent layout"),
    }


def test_bad_latent_files_are_refused_before_loading_weights(tmp_path, capsys):
    missing_vae = tmp_path / "no-such-vae"  # never reached: the latents are checked first
    for what, (path, message) in _bad_files(tmp_path).items():
        code, _, err = _decode(capsys, path, "--vae", missing_vae, "--out", tmp_path / "out.npy")
        assert code == 2, what
        assert "h3director decode: error:" in err and __import__("re").search(message, err), (what, err)
    assert not (tmp_path / "out.npy").exists()


def test_bad_requests_are_refused_before_decoding(vae_dir, tmp_path, capsys):
    save_file({"latents": _latents()}, tmp_path / "z.safetensors")
    save_file({"latents": torch.randn(1, 16, 7, 4, 6)}, tmp_path / "c16.safetensors")
    save_file({"latents": torch.randn(2, 24, 7, 4, 6)}, tmp_path / "b2.safetensors")
    nan = _latents()
    nan[0, 3, 2, 1, 1] = float("nan")
    save_file({"latents": nan}, tmp_path / "nan.safetensors")
    existing = tmp_path / "keep.npy"
    existing.write_bytes(b"earlier output")
    cases = [
        (["z.safetensors", "--out", tmp_path / "v.avi"], "--out: output must end in .npy or .mp4"),
        (["z.safetensors", "--out", tmp_path / "nofolder" / "v.mp4"], "output folder .* does not exist"),
        (["z.safetensors", "--out", tmp_path / "v.mp4", "--sink", "memmap"], "--sink memmap needs a file ending in .npy"),
        (["z.safetensors", "--out", tmp_path / "v.mp4", "--resume"], "--resume works with .npy outputs only"),
        (["z.safetensors", "--out", tmp_path / "v.npy", "--audio-vae", vae_dir], "holds no 'audio_latents'"),
        (["c16.safetensors", "--out", existing], "24 channels"),
        (["b2.safetensors", "--out", existing], "holds a batch of 2 videos; a file output takes one"),
        (["nan.safetensors", "--out", existing], "NaN/inf"),
        (["z.safetensors", "--out", existing, "--budget", "1MB"], "but the budget from the budget argument is 1.00 MiB"),
    ]
    for argv, message in cases:
        code, _, err = _decode(capsys, tmp_path / argv[0], "--vae", vae_dir, *argv[1:])
        assert code == 2, (argv, err)
        assert __import__("re").search(message, err), (argv, err)
    assert existing.read_bytes() == b"earlier output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.safetensors", "c16.safetensors", "keep.npy",
                                                          "nan.safetensors", "z.safetensors"]


def test_bad_weight_paths_are_refused(tmp_path, capsys):
    save_file({"latents": _latents()}, tmp_path / "z.safetensors")
    (tmp_path / "empty").mkdir()
    (tmp_path / "w.bin").write_bytes(b"pickle")
    for vae, message in [(tmp_path / "nothing", "does not exist"),
                         (tmp_path / "empty", "folder without config.json"),
                         (tmp_path / "w.bin", "must be a diffusers folder or a .safetensors file")]:
        code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", vae, "--out", tmp_path / "o.npy")
        assert code == 2 and message in err, err


def test_read_header_limits_are_the_callers():
    limits = SafetensorsLimits(max_header_bytes=64, max_tensors=1, max_rank=2, max_dim=10)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.safetensors"
        save_file({"x": torch.zeros(3, 4)}, path)
        assert read_header(path).tensors["x"].shape == (3, 4)
        save_file({"x": torch.zeros(3, 11)}, path)
        with pytest.raises(InvalidInputError, match="dimension above 10"):
            read_header(path, SafetensorsLimits(max_dim=10))
        save_file({"x": torch.zeros(1, 1, 1)}, path)
        with pytest.raises(InvalidInputError, match="rank 3, more than 2"):
            read_header(path, limits)


# -- weights that do not fit the model: one clear error before anything is materialised ------------

def test_weights_whose_keys_do_not_fit_the_config_are_refused_with_counts(vae_dir, tmp_path, capsys):
    from h3director.commands.demo_vaes import tiny_h3_audio_vae

    save_file({"latents": _latents()}, tmp_path / "z.safetensors")
    folder = tmp_path / "mixed"
    tiny_h3_audio_vae(seed=1).save_pretrained(tmp_path / "audio")
    folder.mkdir()
    (folder / "config.json").write_text((vae_dir / "vae" / "config.json").read_text())
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(
        (tmp_path / "audio" / "diffusion_pytorch_model.safetensors").read_bytes())
    code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", folder, "--out", tmp_path / "o.npy")
    assert code == 2, err
    assert "meta tensor" not in err and len(err) < 2000, err
    assert err.count("\n") == 1 and err.startswith("h3director decode: error:"), err
    match = __import__("re").search(r"(\d+) missing, (\d+) unexpected, (\d+) with another shape", err)
    assert match and int(match.group(1)) > 0 and int(match.group(2)) > 0, err
    assert "e.g. missing" in err and "AutoencoderKLMiniMaxH3" in err
    assert not (tmp_path / "o.npy").exists()


def test_a_weights_file_of_another_size_is_refused_with_the_shapes(vae_dir, tmp_path, capsys):
    from h3director.commands.demo_vaes import tiny_h3_vae

    save_file({"latents": _latents()}, tmp_path / "z.safetensors")
    other = tmp_path / "other"
    tiny_h3_vae(seed=1).save_pretrained(other)
    config = json.loads((other / "config.json").read_text())
    config["decoder_attention_head_dim"] = 8  # same keys, other shapes
    (other / "config.json").write_text(json.dumps(config))
    code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", other / "diffusion_pytorch_model.safetensors",
                           "--out", tmp_path / "o.npy")
    assert code == 2 and "0 missing, 0 unexpected" in err and "with another shape" in err, err
    assert "file [" in err and "model [" in err, err


def test_a_single_weights_file_without_config_is_refused_unless_asked_for(vae_dir, tmp_path, capsys):
    save_file({"latents": _latents()}, tmp_path / "z.safetensors")
    alone = tmp_path / "alone.safetensors"
    alone.write_bytes((vae_dir / "vae" / "diffusion_pytorch_model.safetensors").read_bytes())
    code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", alone, "--out", tmp_path / "o.npy")
    assert code == 2, err
    assert "no config.json beside" in err and "latents_mean 0 and latents_std 1 for all 24 channels" in err, err
    assert "z * latents_std[c] + latents_mean[c]" in err and "--default-config" in err, err
    # With the flag the defaults are used: the real (full-size) class, which these tiny weights do not fit.
    code, _, err = _decode(capsys, tmp_path / "z.safetensors", "--vae", alone, "--out", tmp_path / "o.npy",
                           "--default-config")
    assert code == 2 and "with another shape" in err and "no config.json" not in err, err
    assert not (tmp_path / "o.npy").exists()
