"""`h3director weights inspect|convert|slim|verify` on small real files.

The DiT is diffusers' real `MiniMaxH3Transformer3DModel` at tiny widths (256 wide, so Q4_K's 256-value
blocks apply), saved with safetensors; GGUFs are written by the command under test and read back through
the validating reader; references are gguf's own quantiser and dequantiser.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from h3director.cli import main
from h3director.weights.dequant import dequantize_tensor
from h3director.weights.gguf_file import open_gguf
from h3director.weights.h3_keys import is_high_precision

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

TINY = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=256, num_layers=2, num_refiner_layers=1,
            ffn_dim=256, text_dim=256, freq_dim=16, time_embed_hidden_dim=32, time_embed_dim=32, rope_freq_dim=2)


def _run(capsys, *argv):
    code = main(["weights", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def tiny_dit(tmp_path_factory):
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MiniMaxH3Transformer3DModel(**TINY).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    folder = tmp_path_factory.mktemp("dit")
    path = folder / "dit.safetensors"
    save_file(state, str(path))
    return path, state, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_0"])
def test_convert_streams_a_real_h3_dit_and_verify_checks_every_tensor(capsys, tmp_path, tiny_dit, qtype):
    source, state, _ = tiny_dit
    out = tmp_path / f"dit-{qtype}.gguf"
    code, text, err = _run(capsys, "convert", str(source), "--type", qtype, "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in text and "diffusers keys, unpruned" in text
    with open_gguf(out) as f:
        assert f.architecture == "minimax_h3"
        assert set(f.tensors) == set(state)
        quantised = 0
        for name, info in f.tensors.items():
            value = state[name]
            assert info.shape == tuple(value.shape)
            got = dequantize_tensor(info)
            if info.qtype == Q[qtype]:
                quantised += 1
                assert not is_high_precision(name) and value.ndim == 2
                if qtype == "Q4_K":  # gguf has no Q4_K encoder: compare with gguf's decoder of the stored bytes
                    expect = quants.dequantize(np.array(info.raw).reshape(value.shape[0], -1), Q.Q4_K)
                    assert (got - value).abs().max() < 0.2 * value.abs().max()
                else:
                    expect = quants.dequantize(quants.quantize(value.numpy(), Q[qtype]), Q[qtype])
                assert torch.equal(got, torch.from_numpy(expect))
            else:  # kept as stored
                assert info.qtype == Q.F32 and torch.equal(got, value), name
        assert quantised >= 4 * TINY["num_layers"]  # every block's q/k/v/out/ff matrices at least
    code, text, err = _run(capsys, "verify", str(out), "--against", str(source))
    assert code == 0, text + err
    assert f"{len(state)} match, 0 mismatch" in text


def test_verify_catches_a_changed_byte_and_reports_hashes(capsys, tmp_path, tiny_dit):
    source, state, _ = tiny_dit
    out = tmp_path / "dit.gguf"
    assert _run(capsys, "convert", str(source), "--type", "Q8_0", "--out", str(out))[0] == 0
    code, text, _ = _run(capsys, "verify", str(out), "--json")
    report = json.loads(text)
    assert code == 0 and report["ok"] and len(report["tensors"]) == len(state)
    fc = next(t for t in report["tensors"] if t["name"] == "transformer_blocks.1.ff.net.2.weight")
    with open_gguf(out) as f:
        info = f.tensors[fc["name"]]
        import hashlib

        assert fc["sha256"] == hashlib.sha256(np.array(info.raw).tobytes()).hexdigest()
        at = info.offset + 40
    data = bytearray(out.read_bytes())
    data[at] ^= 0x5A
    out.write_bytes(bytes(data))
    code, text, _ = _run(capsys, "verify", str(out), "--against", str(source))
    assert code == 1
    assert "transformer_blocks.1.ff.net.2.weight  MISMATCH: re-quantised bytes differ" in text


def _comfy_pruned_state() -> dict[str, torch.Tensor]:
    """A pruned (curve-form) DiT in ComfyUI's key style, with one 5-D tensor beyond ggml's 4 dims."""
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    state = {"video_patch_proj.weight": r(64, 96), "audio_patch_proj.weight": r(64, 32),
             "condition_proj.weight": r(64, 64), "adaln_t_table": r(1000, 32), "rope.inv_freq": r(4),
             "final_layer.video_out.weight": r(96, 64), "final_layer.audio_out.weight": r(32, 64),
             "extra.conv.weight": r(64, 2, 1, 2, 16)}
    for i in range(2):
        state |= {f"blocks.{i}.attn.qkv_proj.weight": r(192, 64), f"blocks.{i}.attn.q_norm.weight": r(32),
                  f"blocks.{i}.mlp.fc1.weight": r(320, 64), f"blocks.{i}.mlp.fc2.weight": r(64, 160)}
    return {k: v.to(torch.bfloat16) for k, v in state.items()}


def test_inspect_an_all_in_one_checkpoint_and_slim_it(capsys, tmp_path):
    dit = _comfy_pruned_state()
    aio = {"model.diffusion_model." + k: v for k, v in dit.items()}
    aio |= {"vae.decoder.conv_in.weight": torch.randn(8, 4, 3, 3), "vae.encoder.conv_in.weight": torch.randn(8, 3),
            "audio_vae.pre_block.attn.zero_k_bias": torch.randn(4),
            "text_encoders.qwen3vl_32b.transformer.model.layers.0.mlp.weight": torch.randn(16, 16)}
    path = tmp_path / "aio.safetensors"
    save_file(aio, str(path))
    code, text, err = _run(capsys, "inspect", str(path), "--json")
    assert code == 0, err
    s = json.loads(text)
    assert s["format"] == "safetensors" and s["params"] == sum(v.numel() for v in aio.values())
    assert {k: v["tensors"] for k, v in s["components"].items()} == {"dit": len(dit), "vae": 2, "audio-vae": 1,
                                                                    "text-encoder": 1}
    assert s["types"]["BF16"]["bytes"] == sum(v.numel() * 2 for v in dit.values())
    assert s["dit"]["pruned"] and s["dit"]["key_style"] == "comfy" and s["dit"]["blocks"] == 2
    code, text, _ = _run(capsys, "inspect", str(path))
    assert "pruned (curve-form adaln_t_table)" in text and "audio-vae" in text

    out = tmp_path / "dit-vae.safetensors"
    code, text, err = _run(capsys, "slim", str(path), "--keep", "dit", "vae", "--dtype", "fp32", "--out", str(out))
    assert code == 0, err
    assert "dropped audio-vae" in text and "dropped text-encoder" in text and "kept    dit" in text
    slimmed = load_file(str(out))
    assert set(slimmed) == {k for k in aio if k.startswith(("model.diffusion_model.", "vae."))}
    assert all(v.dtype == torch.float32 and torch.equal(v, aio[k].float()) for k, v in slimmed.items())
    code, text, _ = _run(capsys, "verify", str(out), "--against", str(path))
    assert code == 0 and "0 mismatch" in text and "2 only there" in text

    # the pruned all-in-one converts: prefix removed, high-precision tensors kept, 5-D tensor reshaped
    gg = tmp_path / "pruned.gguf"
    code, text, err = _run(capsys, "convert", str(path), "--type", "Q8_0", "--out", str(gg))
    assert code == 0, err
    assert "comfy keys, pruned" in text and "left out (not the DiT): 4 tensors" in text
    with open_gguf(gg) as f:
        assert f.metadata["comfy.gguf.orig_shape.extra.conv.weight"] == [64, 2, 1, 2, 16]
        info = f.tensors["extra.conv.weight"]
        assert info.shape == (64, 2, 1, 2, 16) and info.ggml_shape == (64, 64) and info.qtype == Q.Q8_0
        assert f.tensors["adaln_t_table"].qtype == Q.BF16
        assert f.tensors["blocks.0.attn.qkv_proj.weight"].qtype == Q.Q8_0
        assert f.tensors["blocks.0.attn.q_norm.weight"].qtype == Q.BF16
        assert dequantize_tensor(info).shape == (64, 2, 1, 2, 16)
    assert _run(capsys, "verify", str(gg), "--against", str(path))[0] == 0


def test_inspect_prices_a_released_width_dit_with_the_planner(capsys, tmp_path):
    """A header-only (sparse) safetensors file with the released widths: inspect reads only the header."""
    shapes = {"video_patch_proj.weight": (5376, 96), "audio_patch_proj.weight": (5376, 32),
              "time_embedder.proj_in.weight": (512, 256)}
    for i in range(2):
        shapes |= {f"blocks.{i}.attn.qkv_proj.weight": (21504, 5376), f"blocks.{i}.mlp.fc1.weight": (28672, 5376),
                   f"blocks.{i}.mlp.fc2.weight": (5376, 14336)}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path = tmp_path / "released.safetensors"
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(blob)) + blob)
        handle.truncate(8 + len(blob) + offset)  # sparse: no data written
    code, text, err = _run(capsys, "inspect", str(path), "--vram", "2GB", "--ram", "64GB", "--json")
    assert code == 0, err
    fits = json.loads(text)["fits"]
    assert fits["dit_weight_bytes"] == offset and fits["dit_resident"] is False
    assert fits["offload_blocks"] in (1, 2)
    assert fits["planner"]["format"] == "bf16" and "fits" in fits["planner"]
    code, text, _ = _run(capsys, "inspect", str(path), "--vram", "80GB", "--ram", "64GB")
    assert "resident on the device" in text and "planner (1280x704, 124 frames, bf16)" in text


def test_standalone_real_vae_files_are_recognised(capsys, tmp_path):
    from h3director.integrations.tiny import tiny_h3_audio_vae, tiny_h3_vae

    for name, model, component in (("vae", tiny_h3_vae(), "vae"), ("audio", tiny_h3_audio_vae(), "audio-vae")):
        path = tmp_path / f"{name}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
        code, text, err = _run(capsys, "inspect", str(path), "--json")
        assert code == 0, err
        summary = json.loads(text)
        assert list(summary["components"]) == [component] and summary["dit"] is None
        assert summary["params"] == sum(v.numel() for v in model.state_dict().values())


@pytest.mark.parametrize("argv,message", [
    (["inspect", "{tmp}/missing.gguf"], "is not a file"),
    (["inspect", "{tmp}/trunc.gguf"], "truncated"),
    (["verify", "{tmp}/trunc.gguf"], "truncated"),
    (["convert", "{src}", "--type", "Q3_K", "--out", "{tmp}/x.gguf"], "not a type the quantiser writes"),
    (["convert", "{src}", "--type", "Q8_0", "--out", "{tmp}/x.bin"], "must end in .gguf"),
    (["convert", "{tmp}/notdit.safetensors", "--type", "Q8_0", "--out", "{tmp}/y.gguf"], "not a MiniMax H3 DiT"),
    (["slim", "{src}", "--keep", "unet", "--out", "{tmp}/s.safetensors"], "--keep takes"),
    (["inspect", "{tmp}/flux.gguf"], None),
])
def test_bad_input_is_one_line_and_exit_2_without_leftovers(capsys, tmp_path, tiny_dit, argv, message):
    source = tiny_dit[0]
    good = tmp_path / "good.gguf"
    assert _run(capsys, "convert", str(source), "--type", "Q8_0", "--out", str(good))[0] == 0
    data = good.read_bytes()
    (tmp_path / "trunc.gguf").write_bytes(data[:len(data) // 2])
    save_file({"patch_embedding.weight": torch.randn(4, 4)}, str(tmp_path / "notdit.safetensors"))
    writer = gguf.GGUFWriter(str(tmp_path / "flux.gguf"), "flux")
    writer.add_tensor("double_blocks.0.img_attn.qkv.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    before = set(tmp_path.iterdir())
    args = [a.format(tmp=tmp_path, src=source) for a in argv]
    code, out, err = _run(capsys, *args)
    if message is None:  # a foreign GGUF is inspected, and the H3 loaders' refusal is shown
        assert code == 0 and "refused by the H3 loaders" in out and "architecture 'flux' is not MiniMax H3" in out
        return
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert set(tmp_path.iterdir()) == before  # nothing written, no temporaries left
