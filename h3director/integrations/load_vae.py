"""Load real VAE weights the user points at: a diffusers folder or a single `.safetensors` file.

Accepted:

- a diffusers model folder (`config.json` + `diffusion_pytorch_model*.safetensors`), or a pipeline
  folder holding one in `vae/` (video) or `audio_vae/` (audio); the class comes from the config's
  `_class_name` and must be one `kind` allows;
- a single `.safetensors` file in diffusers' key layout; its config is the `config.json` beside it.
  Without one it is refused, unless ``allow_default_config`` (``h3director decode --default-config``)
  accepts the defaults of the real class (H3 video or audio VAE): the H3 video defaults carry neutral
  latent statistics (mean 0, std 1), so latents made for a real model would decode with wrong colours.

Every weight file's header is validated (size limits, offsets) before diffusers reads it, and only
safetensors are loaded (never pickles). The tensor names and shapes the headers declare are checked
against the model the config describes (built on the meta device, no memory) before any weight is
read: weights that do not fit are refused with how many tensors are missing, unexpected or of
another shape, and examples of each.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
import warnings
from pathlib import Path

import torch

from h3director.core.safetensors_header import WEIGHT_LIMITS, SafetensorsHeader, read_header
from h3director.errors import InvalidInputError

VAE_CLASSES = {
    "video": ("AutoencoderKLMiniMaxH3", "AutoencoderKLWan"),
    "audio": ("AutoencoderKLMiniMaxH3Audio",),
}
PIPELINE_SUBFOLDERS = {"video": "vae", "audio": "audio_vae"}
_MAX_CONFIG_BYTES = 1 << 20
_WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # what diffusers' from_pretrained reads in a folder
_EXAMPLES = 3  # names shown per kind of mismatch
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


def _model_tensors(cls, config: dict, where: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the state dict of ``cls`` built from ``config`` on the meta
    device (no memory is allocated, nothing is initialised)."""
    try:
        with torch.device("meta"):
            model = cls.from_config(config)
    except (TypeError, ValueError, RuntimeError, KeyError, AttributeError) as exc:
        raise InvalidInputError(f"{where!r} does not describe a buildable {cls.__name__}: {exc}") from exc
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _check_tensors(cls, config: dict, headers: list[SafetensorsHeader], weights: str, config_where: str) -> None:
    """Refuse weights whose tensor names or shapes do not fit the model ``config`` describes.

    Missing or differently shaped tensors are refused (diffusers would leave the missing ones on the
    meta device and fail much later); tensors the model does not have only warn (diffusers ignores them).
    """
    expected = _model_tensors(cls, config, config_where)
    found: dict[str, tuple[int, ...]] = {}
    for header in headers:
        found.update({name: entry.shape for name, entry in header.tensors.items()})
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    reshaped = sorted(name for name in set(expected) & set(found) if expected[name] != found[name])
    if not missing and not reshaped:
        if unexpected:
            warnings.warn(f"{weights!r}: {len(unexpected)} tensor(s) that {cls.__name__} does not have are ignored, "
                          f"e.g. {', '.join(unexpected[:_EXAMPLES])}", stacklevel=4)
        return
    examples = []
    if missing:
        examples.append(f"missing {', '.join(missing[:_EXAMPLES])}")
    if unexpected:
        examples.append(f"unexpected {', '.join(unexpected[:_EXAMPLES])}")
    for name in reshaped[:_EXAMPLES]:
        examples.append(f"{name}: file {list(found[name])} vs model {list(expected[name])}")
    common = len(set(expected) & set(found))
    hint = ("no tensor name in common: not diffusers' key layout for this class, or another model's weights"
            if not common else
            "weights of another model or size than the config describes")
    raise InvalidInputError(
        f"{weights!r} does not fit {cls.__name__} as {config_where!r} configures it ({len(expected)} tensors): "
        f"{len(missing)} missing, {len(unexpected)} unexpected, {len(reshaped)} with another shape; "
        f"e.g. {'; '.join(examples)} ({hint})"
    )


def _loaded_files(folder: Path) -> list[Path] | None:
    """The weight files diffusers' from_pretrained reads in ``folder`` (one file, or the shards of its
    index), or None when it would find none (its own error then says so)."""
    single = folder / _WEIGHTS_NAME
    if single.is_file():
        return [single]
    index = folder / f"{_WEIGHTS_NAME}.index.json"
    if not index.is_file():
        return None
    weight_map = _read_config(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InvalidInputError(f"{str(index)!r} must hold a 'weight_map' of tensor name -> shard file name")
    shards = []
    for name in sorted(set(weight_map.values())):
        shard = folder / name
        if Path(name).name != name or not shard.is_file():
            raise InvalidInputError(f"{str(index)!r} names the shard {name!r}, which is not a file in {str(folder)!r}")
        shards.append(shard)
    return shards


def _from_folder(folder: Path, kind: str, dtype: torch.dtype):
    config_path = folder / "config.json"
    config = _read_config(config_path)
    cls = _class_for(config, kind, str(config_path))
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise InvalidInputError(f"{str(folder)!r} holds no .safetensors weights (pickled .bin files are not loaded)")
    headers = {weight: read_header(weight, WEIGHT_LIMITS) for weight in weights}
    loaded = _loaded_files(folder)
    if loaded is not None:
        _check_tensors(cls, config, [headers.get(f) or read_header(f, WEIGHT_LIMITS) for f in loaded],
                       str(folder), str(config_path))
    try:
        return cls.from_pretrained(str(folder), torch_dtype=dtype, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise InvalidInputError(f"cannot load {cls.__name__} from {str(folder)!r}: {exc}") from exc


def _default_statistics(cls) -> str:
    """What the class's default config holds as latent statistics, in words."""
    parameters = inspect.signature(cls.__init__).parameters
    mean = parameters["latents_mean"].default if "latents_mean" in parameters else None
    std = parameters["latents_std"].default if "latents_std" in parameters else None
    if mean is None or std is None:
        return "no latent statistics (latents_mean and latents_std unset), so latents cannot be denormalized"
    if all(value == 0 for value in mean) and all(value == 1 for value in std):
        return (f"neutral latent statistics (latents_mean 0 and latents_std 1 for all {len(mean)} channels), so "
                "every latent channel c would reach the decoder as z instead of z * latents_std[c] + "
                "latents_mean[c]: colours and contrast off by the model's own per-channel scale and offset")
    return "the latent statistics of the class's default model, which may not be this file's"


def _from_single_file(file: Path, kind: str, dtype: torch.dtype, allow_default_config: bool):
    header = read_header(file, WEIGHT_LIMITS)
    beside = file.with_name("config.json")
    if beside.is_file():
        config = _read_config(beside)
        config_where = str(beside)
    else:
        import diffusers

        default = VAE_CLASSES[kind][0]
        if not allow_default_config:
            raise InvalidInputError(
                f"no config.json beside {str(file)!r}: the defaults of {default} would be used, with "
                f"{_default_statistics(getattr(diffusers, default))}. Put the model's config.json beside the file "
                "or pass its diffusers folder; to use the defaults anyway, pass --default-config "
                "(load_vae(..., allow_default_config=True))"
            )
        config = {"_class_name": default}
        config_where = f"the defaults of {default}"
    cls = _class_for(config, kind, config_where)
    _check_tensors(cls, config, [header], str(file), config_where)
    with tempfile.TemporaryDirectory(prefix="h3director-vae-") as folder:
        Path(folder, "config.json").write_text(json.dumps(config), encoding="utf-8")
        os.symlink(file.absolute(), Path(folder, _WEIGHTS_NAME))
        try:
            model = cls.from_pretrained(folder, torch_dtype=dtype, use_safetensors=True)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            names = sorted(header.tensors)[:3]
            raise InvalidInputError(
                f"cannot load {str(file)!r} as {cls.__name__} (diffusers key layout expected; the file starts "
                f"with {names}): {exc}"
            ) from exc
    return model


def load_vae(path: str | os.PathLike, kind: str = "video", dtype: str = "float32", device: str = "cpu", *,
             allow_default_config: bool = False):
    """Load a real diffusers VAE of `kind` ("video" or "audio") from `path`, in eval mode on `device`. Returns
    the VAE module (`dtype` "float32", "float16" or "bfloat16").

    Raises `InvalidInputError` for a missing path, a file that is not `.safetensors`, a folder that is
    not a diffusers model, a config naming another class, weights whose tensor names or shapes do not
    fit the configured model (checked before any weight is read), or a single file without a
    `config.json` beside it unless `allow_default_config` accepts the class's defaults.
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
        model = _from_single_file(path, kind, _DTYPES[dtype], allow_default_config)
    else:
        raise InvalidInputError(
            f"{kind} VAE path {str(path)!r} must be a diffusers folder or a .safetensors file, got {path.suffix!r}"
        )
    return model.to(device).eval().requires_grad_(False)


def video_adapter_for(vae):
    """The streaming-decode adapter for a loaded diffusers video VAE: `H3VideoAdapter` for
    `AutoencoderKLMiniMaxH3`, `WanVideoAdapter` for `AutoencoderKLWan`; `InvalidInputError` for any other
    class."""
    name = type(vae).__name__
    if name == "AutoencoderKLMiniMaxH3":
        from h3director.integrations.diffusers_h3 import H3VideoAdapter

        return H3VideoAdapter(vae)
    if name == "AutoencoderKLWan":
        from h3director.integrations.diffusers_wan import WanVideoAdapter

        return WanVideoAdapter(vae)
    raise InvalidInputError(f"no streaming video adapter for {name}; expected one of {', '.join(VAE_CLASSES['video'])}")


def audio_adapter_for(vae):
    """The chunked-decode `H3AudioAdapter` for a loaded `AutoencoderKLMiniMaxH3Audio`; `InvalidInputError`
    for any other class."""
    name = type(vae).__name__
    if name != "AutoencoderKLMiniMaxH3Audio":
        raise InvalidInputError(f"no audio adapter for {name}; expected AutoencoderKLMiniMaxH3Audio")
    from h3director.integrations.diffusers_h3_audio import H3AudioAdapter

    return H3AudioAdapter(vae)


__all__ = ["audio_adapter_for", "load_vae", "video_adapter_for"]
