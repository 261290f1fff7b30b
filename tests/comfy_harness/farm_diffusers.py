"""A tiny random-initialised diffusers H3 pipeline folder for the farm's diffusers jobs (tests, bench).

`write_tiny_pipeline(folder)` saves (`save_pretrained`) a small real `MiniMaxH3Transformer3DModel` (2 blocks
of 2 heads x 16, text_dim 32, the released 24 video / 32 audio latent channels), `tiny_h3_vae()` and a
`MiniMaxH3Scheduler` (shift 12) under transformer/, vae/, scheduler/; `write_embeds(path)` saves
prompt embeddings [1, 8, 32] for it.
"""

from __future__ import annotations

from pathlib import Path

TEXT_DIM = 32


def write_tiny_pipeline(folder: Path) -> Path:
    import torch
    from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel

    from h3director.commands.demo_vaes import tiny_h3_vae

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = MiniMaxH3Transformer3DModel(
            num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=2, num_refiner_layers=1,
            ffn_dim=64, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=TEXT_DIM, freq_dim=32,
            time_embed_hidden_dim=32, time_embed_dim=24, rope_freq_dim=2).eval()
    transformer.save_pretrained(folder / "transformer")
    tiny_h3_vae().save_pretrained(folder / "vae")
    MiniMaxH3Scheduler(shift=12.0).save_pretrained(folder / "scheduler")
    return folder


def write_embeds(path: Path, tokens: int = 8, width: int = TEXT_DIM, seed: int = 1) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({"prompt_embeds": torch.randn(1, tokens, width, generator=torch.Generator().manual_seed(seed))},
              str(path))
    return path
