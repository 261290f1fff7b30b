"""Load real VAE weights the user points at: a diffusers folder or a single `.safetensors` file.

Accepted:

- a diffusers model folder (`config.json` + `diffusion_pytorch_model*.safetensors`), or a pipeline
  folder holding one in `vae/` (video) or `audio_vae/` (audio); the class comes from the config's
  `_class_name` and must be one `kind` allows;
- a single `.safetensors` file in diffusers' key layout; its config is the `config.json` beside it
  when there is one, else the defaults of the real class (H3 video or audio VAE). The defaults carry
  neutral latent statistics (mean 0, std 1), which a warning points out.

Every weight file's header is validated (size limits, offsets) before diffusers reads it, and only
safetensors are loaded (never pickles).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

from h3director.core.safetensors_header import WEIGHT_LIMITS, read_header
from h3director.errors import InvalidInputError

VAE_CLASSES = {
    "video": ("AutoencoderKLMiniMaxH3", "AutoencoderKLWan"),
    "audio": ("AutoencoderKLMiniMaxH3Audio",),
}
PIPELINE_SUBFOLDERS = {"video": "vae", "audio": "audio_vae"}
_MAX_CONFIG_BYTES = 1 << 20
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _read_config(path: Path) -> dict:
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise InvalidInputError(f"{str(path)!r} is larger than {_MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{str(path)!r} is not a readable JSON config: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidInputError(f"{str(path)!r} must hold a JSON object")
    return config


def _class_for(config: dict, kind: str, where: str):
    import diffusers

    name = config.get("_class_name", VAE_CLASSES[kind][0])
    if name not in VAE_CLASSES[kind]:
        raise InvalidInputError(
            f"{where!r} configures {name!r}, but a {kind} VAE must be one of {', '.join(VAE_CLASSES[kind])}"
        )
    return getattr(diffusers, name)


def _model_folder(path: Path, kind: str) -> Path:
    for folder in (path, path / PIPELINE_SUBFOLDERS[kind]):
        if (folder / "config.json").is_file():
            return folder
    raise InvalidInputError(
        f"{str(path)!r} is a folder without config.json (nor {PIPELINE_SUBFOLDERS[kind]}/config.json): "
        "expected a diffusers model folder, or pass the weights .safetensors file itself"
    )


def _from_folder(folder: Path, kind: str, dtype: torch.dtype):
    cls = _class_for(_read_config(folder / "config.json"), kind, str(folder / "config.json"))
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise InvalidInputError(f"{str(folder)!r} holds no .safetensors weights (pickled .bin files are not loaded)")
    for weight in weights:
        read_header(weight, WEIGHT_LIMITS)
    try:
        return cls.from_pretrained(str(folder), torch_dtype=dtype, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise InvalidInputError(f"cannot load {cls.__name__} from {str(folder)!r}: {exc}") from exc


def _from_single_file(file: Path, kind: str, dtype: torch.dtype):
    header = read_header(file, WEIGHT_LIMITS)
    beside = file.with_name("config.json")
    if beside.is_file():
        config = _read_config(beside)
    else:
        config = {"_class_name": VAE_CLASSES[kind][0]}
        warnings.warn(
            f"no config.json beside {str(file)!r}: using the defaults of {VAE_CLASSES[kind][0]}, whose latent "
            "statistics are neutral (mean 0, std 1); put the model's config.json beside the file if it has one",
            stacklevel=3,
        )
    cls = _class_for(config, kind, str(beside))
    with tempfile.TemporaryDirectory(prefix="h3director-vae-") as folder:
        Path(folder, "config.json").write_text(json.dumps(config), encoding="utf-8")
        os.symlink(file.absolute(), Path(folder, "diffusion_pytorch_model.safetensors"))
        try:
            model = cls.from_pretrained(folder, torch_dtype=dtype, use_safetensors=True)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            names = sorted(header.tensors)[:3]
            raise InvalidInputError(
                f"cannot load {str(file)!r} as {cls.__name__} (diffusers key layout expected; the file starts "
                f"with {names}): {exc}"
            ) from exc
    return model


def load_vae(path: str | os.PathLike, kind: str = "video", dtype: str = "float32", device: str = "cpu"):
    """Load a real diffusers VAE of `kind` ("video" or "audio") from `path`, in eval mode on `device`.

    Raises `InvalidInputError` for a missing path, a file that is not `.safetensors`, a folder that is
    not a diffusers model, a config naming another class, or weights that do not fit the class.
    """
    if kind not in VAE_CLASSES:
        raise InvalidInputError(f"kind must be one of {sorted(VAE_CLASSES)}, got {kind!r}")
    if dtype not in _DTYPES:
        raise InvalidInputError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    path = Path(path).expanduser()
    if not path.exists():
        raise InvalidInputError(f"{kind} VAE path {str(path)!r} does not exist")
    if path.is_dir():
        model = _from_folder(_model_folder(path, kind), kind, _DTYPES[dtype])
    elif path.suffix.lower() == ".safetensors":
        model = _from_single_file(path, kind, _DTYPES[dtype])
    else:
        raise InvalidInputError(
            f"{kind} VAE path {str(path)!r} must be a diffusers folder or a .safetensors file, got {path.suffix!r}"
        )
    return model.to(device).eval().requires_grad_(False)


def video_adapter_for(vae):
    """The streaming-decode adapter for a loaded diffusers video VAE (H3 or Wan)."""
    name = type(vae).__name__
    if name == "AutoencoderKLMiniMaxH3":
        from h3director.integrations.diffusers_h3 import H3VideoAdapter

        return H3VideoAdapter(vae)
    if name == "AutoencoderKLWan":
        from h3director.integrations.diffusers_wan import WanVideoAdapter

        return WanVideoAdapter(vae)
    raise InvalidInputError(f"no streaming video adapter for {name}; expected one of {', '.join(VAE_CLASSES['video'])}")


def audio_adapter_for(vae):
    """The chunked-decode adapter for a loaded diffusers H3 audio VAE."""
    name = type(vae).__name__
    if name != "AutoencoderKLMiniMaxH3Audio":
        raise InvalidInputError(f"no audio adapter for {name}; expected AutoencoderKLMiniMaxH3Audio")
    from h3director.integrations.diffusers_h3_audio import H3AudioAdapter

    return H3AudioAdapter(vae)
