"""`h3director weights inspect|convert|slim|verify` on small real files.

The DiT is diffusers' real `MiniMaxH3Transformer3DModel` at tiny widths (256 wide, so the K-quants' 256-value
blocks apply), in ComfyUI's key layout (what the GGUF loaders read; `gguf_helpers.comfy_keyed`) and, for the
refusal, in its own diffusers layout, saved with safetensors; GGUFs are written by the command under test and
read back through the validating reader; references are gguf's own quantiser and dequantiser (K-quants: the
project's encoder, gguf has none, and gguf's dequantiser of the stored bytes).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from gguf_helpers import comfy_keyed
from safetensors.torch import load_file, save_file

from h3director.cli import main
from h3director.commands.weights import CONVERT_TYPES
from h3director.weights import kquant
from h3director.weights.convert import TYPES, mix_type
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
    diffusers_state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state = {k: v.contiguous() for k, v in comfy_keyed(model).items()}
    folder = tmp_path_factory.mktemp("dit")
    path = folder / "dit.safetensors"
    save_file(state, str(path))
    save_file(diffusers_state, str(folder / "dit-diffusers-keys.safetensors"))
    return path, state, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q6_K", "Q5_K", "Q4_K", "Q4_K_M"])
def test_convert_streams_a_real_h3_dit_and_verify_checks_every_tensor(capsys, tmp_path, tiny_dit, type_name):
    source, state, _ = tiny_dit
    out = tmp_path / f"dit-{type_name}.gguf"
    code, text, err = _run(capsys, "convert", str(source), "--type", type_name.lower(), "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in text and "comfy keys, unpruned" in text and "loads with the ComfyUI node" in text
    counts = {"blocks.": TINY["num_layers"], "token_refiner.blocks.": TINY["num_refiner_layers"]}
    with open_gguf(out) as f:
        assert f.architecture == "minimax_h3" and f.metadata["h3director.convert.type"] == type_name
        assert set(f.tensors) == set(state)
        quantised = {}
        for name, info in f.tensors.items():
            value = state[name]
            assert info.shape == tuple(value.shape)
            got = dequantize_tensor(info)
            if info.qtype != Q.F32:
                kind = mix_type(name, "Q4_K", "Q6_K", counts) if type_name == "Q4_K_M" else type_name
                assert info.qtype == Q[kind], name
                quantised[name] = kind
                assert not is_high_precision(name) and value.ndim == 2
                if kind in kquant.ENCODERS:  # gguf has no K-quant encoder: ours, decoded by gguf
                    stored = np.array(info.raw).reshape(value.shape[0], -1)
                    assert np.array_equal(stored, kquant.quantize(value.numpy(), kind))
                    expect = quants.dequantize(stored, Q[kind])
                else:
                    expect = quants.dequantize(quants.quantize(value.numpy(), Q[kind]), Q[kind])
                assert torch.equal(got, torch.from_numpy(expect))
            else:  # kept as stored
                assert torch.equal(got, value), name
        assert len(quantised) >= 4 * TINY["num_layers"]  # every block's qkv/out/fc1/fc2 matrices at least
        if type_name == "Q4_K_M":  # block 1 of 2 and the single refiner block get the Q6_K value/FFN-down
            assert sorted(n for n, k in quantised.items() if k == "Q6_K") == [
                "blocks.1.attn.qkv_proj.weight", "blocks.1.mlp.fc2.weight", "token_refiner.blocks.0.attn.qkv_proj.weight",
                "token_refiner.blocks.0.mlp.fc2.weight"]
    code, text, err = _run(capsys, "verify", str(out), "--against", str(source))
    assert code == 0, text + err
    assert f"checked all {len(state)} tensors" in text and f"{len(state)} match, 0 mismatch" in text


def test_convert_types_are_the_ones_the_cli_names():
    assert set(CONVERT_TYPES) == set(TYPES)
    assert {"Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_K_M"} <= set(TYPES)


def test_verify_catches_a_changed_byte_and_reports_hashes(capsys, tmp_path, tiny_dit):
    source, state, _ = tiny_dit
    out = tmp_path / "dit.gguf"
    assert _run(capsys, "convert", str(source), "--type", "Q8_0", "--out", str(out))[0] == 0
    code, text, _ = _run(capsys, "verify", str(out), "--json")
    report = json.loads(text)
    assert code == 0 and report["ok"] and len(report["tensors"]) == report["checked"] == len(state)
    fc = next(t for t in report["tensors"] if t["name"] == "blocks.1.mlp.fc2.weight")
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
    assert "blocks.1.mlp.fc2.weight  MISMATCH: re-quantised bytes differ" in text


def _comfy_pruned_state() -> dict[str, torch.Tensor]:
    """A pruned (curve-form) DiT with every tensor of ComfyUI's H3 model (hidden 64, 2 blocks, 1 refiner block)."""
    from h3director.weights.h3_keys import comfy_dit_keys

    g = torch.Generator().manual_seed(1)
    shapes = {"video_patch_proj.weight": (64, 96), "audio_patch_proj.weight": (64, 32), "condition_proj.weight": (64, 64),
              "adaln_t_table": (1000, 32), "rope.inv_freq": (4,), "final_layer.video_out.weight": (96, 64),
              "final_layer.video_out.bias": (96,), "final_layer.audio_out.weight": (32, 64),
              "final_layer.audio_out.bias": (32,), "final_layer.adaln_proj.linear.weight": (128, 32),
              "final_layer.adaln_proj.linear.bias": (128,)}
    by_role = {"attn.qkv_proj.weight": (192, 64), "attn.out_proj.weight": (64, 64), "attn.q_norm.weight": (32,),
               "attn.k_norm.weight": (32,), "mlp.fc1.weight": (320, 64), "mlp.fc2.weight": (64, 160),
               "adaln_proj.linear.weight": (1152, 32), "adaln_proj.linear.bias": (1152,)}
    names = {"adaln_t_table", "blocks.1.norm1.weight", "token_refiner.blocks.0.norm1.weight"}
    state = {}
    for name in sorted(comfy_dit_keys(names)):
        role = name.split(".", 2)[-1] if name.startswith("blocks.") else name.split(".", 3)[-1]
        shape = shapes.get(name) or by_role.get(role) or (64,)
        state[name] = torch.randn(*shape, generator=g).to(torch.bfloat16)
    return state


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

    # the pruned all-in-one converts: prefix removed, high-precision tensors kept
    gg = tmp_path / "pruned.gguf"
    code, text, err = _run(capsys, "convert", str(path), "--type", "Q8_0", "--out", str(gg))
    assert code == 0, err
    assert "comfy keys, pruned" in text and "left out (not the DiT): 4 tensors" in text
    with open_gguf(gg) as f:
        assert set(f.tensors) == set(dit)
        assert f.tensors["adaln_t_table"].qtype == Q.BF16
        assert f.tensors["blocks.0.attn.qkv_proj.weight"].qtype == Q.Q8_0
        assert f.tensors["blocks.0.attn.q_norm.weight"].qtype == Q.BF16
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
    from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae

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
    (["convert", "{src}", "--type", "TQ1_0", "--out", "{tmp}/x.gguf"], "not a type the quantiser writes"),
    (["convert", "{dsrc}", "--type", "Q4_K_M", "--out", "{tmp}/x.gguf"],
     "H3 DiT with diffusers keys (e.g. token_refiner.refiner_blocks.0.attn.to_k.weight"),
    (["convert", "{dsrc}", "--type", "Q4_K_M", "--out", "{tmp}/x.gguf"], "Load this file as safetensors with diffusers"),
    (["convert", "{tmp}/fewer.safetensors", "--type", "Q5_K", "--out", "{tmp}/x.gguf"],
     "1 missing (e.g. blocks.1.mlp.fc2.weight); 1 unexpected (e.g. blocks.1.mlp.fc3.weight)"),
    (["convert", "{tmp}/fived.safetensors", "--type", "Q8_0", "--out", "{tmp}/x.gguf"], "has 5 dims, more than"),
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
    state = dict(tiny_dit[1])
    state["blocks.1.mlp.fc3.weight"] = state.pop("blocks.1.mlp.fc2.weight")
    save_file(state, str(tmp_path / "fewer.safetensors"))
    state = dict(tiny_dit[1])
    state["blocks.0.mlp.fc2.weight"] = state["blocks.0.mlp.fc2.weight"].reshape(256, 2, 2, 4, 16)
    save_file(state, str(tmp_path / "fived.safetensors"))
    writer = gguf.GGUFWriter(str(tmp_path / "flux.gguf"), "flux")
    writer.add_tensor("double_blocks.0.img_attn.qkv.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    before = set(tmp_path.iterdir())
    args = [a.format(tmp=tmp_path, src=source, dsrc=source.parent / "dit-diffusers-keys.safetensors") for a in argv]
    code, out, err = _run(capsys, *args)
    if message is None:  # a foreign GGUF is inspected, and the H3 loaders' refusal is shown
        assert code == 0 and "refused by the H3 loaders" in out and "architecture 'flux' is not MiniMax H3" in out
        return
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert set(tmp_path.iterdir()) == before  # nothing written, no temporaries left


def test_verify_checks_every_tensor_of_an_all_in_one_file_and_catches_a_small_one(capsys, tmp_path):
    """Video and audio VAE both hold `latents_mean`/`latents_std` (a few values each): none of the four may be
    skipped or compared with the other component's tensor of the same name."""
    g = torch.Generator().manual_seed(2)
    aio = {"model.diffusion_model." + k: v for k, v in _comfy_pruned_state().items()}
    aio |= {f"{c}.{k}": torch.randn(n, generator=g) for c, n in (("vae", 48), ("audio_vae", 16))
            for k in ("latents_mean", "latents_std")}
    aio |= {"vae.decoder.conv_in.weight": torch.randn(8, 4, 3, 3, generator=g),
            "audio_vae.pre_block.attn.zero_k_bias": torch.randn(4, generator=g)}
    original, copy = tmp_path / "aio.safetensors", tmp_path / "copy.safetensors"
    save_file(aio, str(original))
    save_file(aio, str(copy))
    code, text, _ = _run(capsys, "verify", str(copy), "--against", str(original), "--json")
    report = json.loads(text)
    assert code == 0 and report["checked"] == len(aio) == len(report["tensors"])
    assert {t["name"] for t in report["tensors"]} == set(aio)
    assert all(t["status"] == "identical bytes" for t in report["tensors"])
    code, text, _ = _run(capsys, "verify", str(copy))
    assert code == 0 and f"checked all {len(aio)} tensors" in text

    tampered = dict(aio)
    tampered["audio_vae.latents_mean"] = aio["audio_vae.latents_mean"].clone()
    tampered["audio_vae.latents_mean"][5] += 0.5
    save_file(tampered, str(copy))
    code, text, _ = _run(capsys, "verify", str(copy), "--against", str(original))
    assert code == 1
    assert f"checked all {len(aio)} tensors" in text and f"{len(aio) - 1} match, 1 mismatch" in text
    assert "audio_vae.latents_mean  MISMATCH: bytes differ" in text
