"""`h3_config.yaml`: loading, validation, environment overrides and the expansion of levels.

Where the configuration comes from (first found wins), then what may change it:

1. the explicit ``path`` given to `load_config`,
2. the file named by ``$H3_CONFIG``,
3. ``./h3_config.yaml`` in the current directory,
4. the packaged default ``h3director/h3_config.yaml`` (every field, commented);

then ``H3_<FIELD>`` environment variables override single fields, nested fields joined with a
double underscore: ``H3_MEMORY_OPTIMIZATION_LEVEL=2``, ``H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB=8000``.
Values are read as YAML scalars (``true``, ``512``, ``0.6``, ``null``, ``[a, b]``). Any other
``H3_`` variable is a problem too (a near miss gets a "did you mean"), except h3director's own
switches in `ENV_NOT_CONFIG`; an error caused by a variable names the variable, not the file.

Units: every ``*_mb`` field is in MiB (1 MiB = 1,048,576 bytes), as PyTorch and ``nvidia-smi``
count. Code below the edges uses the ``*_bytes`` properties.

An invalid file is refused with EVERY problem listed (field path, the bad value, what is allowed);
unknown keys are errors with a "did you mean". `H3Config.features()` is the one place where
``memory_optimization_level`` expands to feature switches; nothing else reads the level.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from h3director.errors import ConfigError
from h3director.units import MiB

#: Largest config file read (bytes). A real h3_config.yaml is a few KiB; anything bigger is refused
#: before parsing, so an untrusted file cannot make the loader spend memory.
MAX_CONFIG_BYTES = 1024 * 1024
#: Largest single environment override value (characters).
MAX_ENV_VALUE_CHARS = 4096
ENV_PREFIX = "H3_"
#: H3_ variables that are not config fields: h3director's own switches, each read where it acts.
ENV_NOT_CONFIG = frozenset({
    "H3_CONFIG",          # the config file itself (this module, comfy/settings.py)
    "H3_NATIVE",          # native core backend: "numpy" or "c" (native/__init__.py)
    "H3_NATIVE_LIB",      # path of the compiled native library (native/_loader.py)
    "H3_NATIVE_CACHE",    # folder of the native libraries built on first use (native/build.py)
    "H3_KERNEL_CACHE",    # the DiT kernel verification cache file (dit/kernel_cache.py)
    "H3_TORCH_VERSION",   # the torch version scripts/setup.sh installs
    "H3_COMFYUI_TARBALL",  # the ComfyUI snapshot scripts/setup_comfyui.sh unpacks
    "H3_COMFYUI_VENV",    # the ComfyUI virtual environment scripts/setup_comfyui.sh makes
    "H3_FARM_COMFYUI",    # `farm run --comfyui`: the ComfyUI folder the farm's workers start (commands/farm.py)
    "H3_FARM_COMFY_PYTHON",  # `farm run --comfy-python`: the Python the workers run ComfyUI with
    "H3_FARM_COMFY_BASE",  # `farm run --comfy-base`: the workers' ComfyUI base folder
})
DEFAULT_CONFIG_NAME = "h3_config.yaml"
#: Fields of earlier releases that no code read; a file that still sets them is told so.
REMOVED_FIELDS = {
    "cross_modal_shared_memory": "no code shared tensors between the video and audio branches",
    "video_upscale": "no upscaler reads it",
    "multi_gpu": "no code placed components on several devices",
    "video_decode.sink": "the output kind comes from the output (--out extension, the node's output input)",
}


class _Section(BaseModel):
    # strict: a YAML "2" (string) is not silently an int, 2.0 is not silently 2, true is not 1.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class VideoDecode(_Section):
    """How decoded frames leave the VAE (see `h3director.video`)."""

    tiles_per_call: int | None = Field(default=None, ge=1)
    oom_retry: bool = True
    crf: int = Field(default=18, ge=0, le=51)
    audio_chunk_seconds: float = Field(default=10.0, gt=0, le=3600)
    host_mmap_threshold_mb: int | None = Field(default=1, ge=0, le=32)


class MemorySafety(_Section):
    """The memory guard: refuse or degrade work that would exceed a budget, before it starts."""

    enabled: bool = True
    max_gpu_memory_mb: int | None = Field(default=None, ge=1)
    max_host_memory_mb: int | None = Field(default=None, ge=1)
    action_on_exceed: Literal["stop_and_clear", "reduce_batch", "fallback_to_cpu"] = "stop_and_clear"

    @property
    def max_gpu_memory_bytes(self) -> int | None:
        return None if self.max_gpu_memory_mb is None else self.max_gpu_memory_mb * MiB

    @property
    def max_host_memory_bytes(self) -> int | None:
        return None if self.max_host_memory_mb is None else self.max_host_memory_mb * MiB


class MonitorSettings(_Section):
    """The background memory sampler (`h3director.core.monitor`)."""

    enable_monitor: bool = False
    update_interval_ms: int = Field(default=500, ge=10, le=60_000)
    show_pool_usage: bool = True
    show_fragmentation: bool = True
    prompt_ledger: bool = True
    leak_prompts: int = Field(default=3, ge=2, le=100)
    leak_min_growth_mb: int = Field(default=16, ge=1, le=1_048_576)


class Allocator(_Section):
    """PyTorch allocator settings, turned into ``PYTORCH_CUDA_ALLOC_CONF`` by `to_pytorch_alloc_conf`.

    They take effect only if set before the first CUDA allocation of the process.
    """

    backend: Literal["native", "cudaMallocAsync"] | None = None
    expandable_segments: bool | None = None
    # PyTorch refuses max_split_size_mb <= 20 (its large-buffer size is 20 MiB).
    max_split_size_mb: int | None = Field(default=None, gt=20)
    garbage_collection_threshold: float | None = Field(default=None, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _async_takes_no_caching_options(self) -> Allocator:
        if self.backend == "cudaMallocAsync":
            caching_only = [
                name
                for name in ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold")
                if getattr(self, name) is not None
            ]
            if caching_only:
                raise ValueError(
                    f"{', '.join(caching_only)} apply only to the native caching allocator, "
                    "not to backend cudaMallocAsync: remove them or set backend to native/null"
                )
        return self

    def to_pytorch_alloc_conf(self) -> str | None:
        """The value for ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``, or None when nothing is set.

        Example: ``"backend:native,expandable_segments:True,max_split_size_mb:512"``.
        """
        parts = []
        if self.backend is not None:
            parts.append(f"backend:{self.backend}")
        if self.expandable_segments is not None:
            parts.append(f"expandable_segments:{self.expandable_segments}")
        if self.max_split_size_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_mb}")
        if self.garbage_collection_threshold is not None:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        return ",".join(parts) or None


@dataclass(frozen=True)
class Features:
    """The switches a memory level turns on, after explicit settings that veto them.

    pool                      the streaming decode's per-clip buffers come from the process-wide slot pool
                              (level >= 1 and pre_allocated_pool_mb > 0)
    generation_gc             a young collection between clips, and the pool's own collections (level >= 2)
    streaming_decode          clip-by-clip decode into a sink (level >= 1; level 0 runs the model's own decode)
    shared_memory             content-keyed tensor store (level 3 and shared_memory_enabled)
    cross_node_shared_memory  the Shared Write/Read and Cached Text Encode nodes use the store (= shared_memory)
    guard                     memory guard (memory_safety.enabled; independent of the level)
    monitor                   background monitor (monitor.enable_monitor; independent of the level)
    debug_shared_memory       verbose checks in the shared store (shared_memory and debug_shared_memory)
    """

    pool: bool
    generation_gc: bool
    streaming_decode: bool
    shared_memory: bool
    cross_node_shared_memory: bool
    guard: bool
    monitor: bool
    debug_shared_memory: bool = False

    def enabled(self) -> list[str]:
        """Names of the switches that are on, in declaration order."""
        return [name for name, value in self.__dict__.items() if value]


class H3Config(_Section):
    """The validated contents of ``h3_config.yaml`` (see the packaged file for every field, commented).

    Levels: 0 off (the model's own decode); 1 streaming decode with per-clip buffers from the slot pool;
    2 + collections between clips; 3 + the shared store used by the nodes. Read switches through
    `features()`; `level_effects()` says what they do in words (shown by `doctor`).
    """

    memory_optimization_level: int = Field(default=2, ge=0, le=3)
    pre_allocated_pool_mb: int = Field(default=0, ge=0)
    pool_slot_mb: int = Field(default=64, ge=1, le=4096)
    generation_gc_interval_ms: int = Field(default=120, ge=1, le=600_000)
    shared_memory_enabled: bool = True
    shared_memory_budget_mb: int = Field(default=1024, ge=1, le=1_048_576)
    debug_shared_memory: bool = False
    video_decode: VideoDecode = Field(default_factory=VideoDecode)
    memory_safety: MemorySafety = Field(default_factory=MemorySafety)
    monitor: MonitorSettings = Field(default_factory=MonitorSettings)
    allocator: Allocator = Field(default_factory=Allocator)

    _source: str = PrivateAttr(default="<defaults>")
    _env_overrides: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("pre_allocated_pool_mb")
    @classmethod
    def _whole_gibibytes(cls, value: int) -> int:
        if value % 1024:
            lower = value // 1024 * 1024
            raise ValueError(
                f"must be a multiple of 1024 (whole GiB; 0 = no pool), e.g. {lower or 1024} or {lower + 1024}"
            )
        return value

    @field_validator("pool_slot_mb")
    @classmethod
    def _slot_fits_pool(cls, value: int, info: ValidationInfo) -> int:
        pool_mb = info.data.get("pre_allocated_pool_mb")  # absent when that field itself was invalid
        if pool_mb and value > pool_mb:
            raise ValueError(f"a slot must fit in the pool: at most pre_allocated_pool_mb ({pool_mb})")
        return value

    def features(self) -> Features:
        """Expand ``memory_optimization_level`` into switches: the only place levels are read."""
        level = self.memory_optimization_level
        shared = level >= 3 and self.shared_memory_enabled
        return Features(
            pool=level >= 1 and self.pre_allocated_pool_mb > 0,
            generation_gc=level >= 2,
            streaming_decode=level >= 1,
            shared_memory=shared,
            cross_node_shared_memory=shared,
            guard=self.memory_safety.enabled,
            monitor=self.monitor.enable_monitor,
            debug_shared_memory=shared and self.debug_shared_memory,
        )

    def level_effects(self) -> list[str]:
        """What the level and its switches do in a run, one line each (what `doctor` prints)."""
        features = self.features()
        lines = []
        if not features.streaming_decode:
            lines.append("decode: the model's own whole-video decode (reference path); the director changes "
                         "nothing: no streaming, no pool, no collections, no shared store")
        else:
            pool = (f"per-clip buffers (clip output, cross-fade tail, uint8 staging) leased from a "
                    f"{self.pre_allocated_pool_mb} MiB pool of {self.pool_slot_mb} MiB slots per device, "
                    "requests it cannot serve counted as fallbacks") if features.pool else \
                "per-clip buffers from the framework allocator (pre_allocated_pool_mb is 0: no pool)"
            lines.append(f"decode: streaming, clip by clip; {pool}")
            lines.append("collections: a young collection between clips" if features.generation_gc
                         else "collections: none between clips (level 2 adds them)")
        if features.shared_memory:
            lines.append(f"shared store: Shared Write/Read and Cached Text Encode nodes keep tensors in memory up to "
                         f"{self.shared_memory_budget_mb} MiB, least recently used spilled to disk")
        else:
            reason = "shared_memory_enabled is false" if self.memory_optimization_level >= 3 else "level 3 turns it on"
            lines.append(f"shared store: off ({reason}); the shared nodes refuse to run, Cached Text Encode encodes "
                         "every time")
        return lines

    def notes(self) -> list[str]:
        """Settings that are valid but have no effect with the current level (shown by `config check`)."""
        notes = []
        level = self.memory_optimization_level
        if level == 0 and self.pre_allocated_pool_mb > 0:
            notes.append("pre_allocated_pool_mb has no effect at memory_optimization_level 0 (the pool is level 1+)")
        if level < 3 and self.debug_shared_memory:
            notes.append("debug_shared_memory has no effect below memory_optimization_level 3")
        return notes

    @property
    def shared_memory_budget_bytes(self) -> int:
        return self.shared_memory_budget_mb * MiB

    @property
    def pool_bytes(self) -> int:
        return self.pre_allocated_pool_mb * MiB

    @property
    def pool_slot_bytes(self) -> int:
        return self.pool_slot_mb * MiB

    @property
    def source(self) -> str:
        """Where the file came from (a path, or ``<defaults>``)."""
        return self._source

    @property
    def env_overrides(self) -> dict[str, Any]:
        """Environment overrides applied, as ``{"H3_NAME": value}``."""
        return dict(self._env_overrides)

    def to_yaml(self) -> str:
        """The effective configuration as YAML (every field)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Problems and their messages


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration: where, what came, what is allowed."""

    path: str
    value: Any
    allowed: str
    origin: str = ""  # "file" or the environment variable name

    def __str__(self) -> str:
        where = f" (from {self.origin})" if self.origin and self.origin != "file" else ""
        if self.value is _MISSING:
            return f"{self.path or 'file'}{where}: {self.allowed}"
        shown = repr(self.value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return f"{self.path or '<top level>'}: {shown}{where} is not allowed; {self.allowed}"


_MISSING = object()


class ConfigValidationError(ConfigError):
    """A configuration was refused; ``problems`` lists each one (all of them, not the first)."""

    def __init__(self, source: str, problems: list[ConfigProblem]):
        self.source = source
        self.problems = list(problems)
        count = len(self.problems)
        variables = list(dict.fromkeys(p.origin for p in self.problems if p.origin not in ("", "file")))
        from_file = any(p.origin in ("", "file") for p in self.problems)
        overrides = f"environment override{'s' if len(variables) != 1 else ''} {', '.join(variables)}"
        if not variables:
            what = f"configuration {source}"
        elif from_file:
            what = f"configuration {source} and {overrides}"
        else:
            what = f"{overrides} (over {source})"
        lines = [f"invalid {what}: {count} problem{'s' if count != 1 else ''}"]
        lines += [f"  - {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


def _model_at(path: tuple[str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = H3Config
    for name in path:
        field = model.model_fields.get(name)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


_TYPE_NAMES = {
    "int_type": "an integer", "bool_type": "true or false", "float_type": "a number", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping of fields",
}
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _bounds_text(loc: tuple[str, ...]) -> str:
    """``"0 <= value <= 3"`` from the field's declared bounds, or "" when it has none."""
    parent = _model_at(loc[:-1]) if loc else None
    field = parent.model_fields.get(loc[-1]) if parent else None
    if field is None:
        return ""
    low = high = ""
    for bound in field.metadata:
        for attr, text in (("ge", "{} <= "), ("gt", "{} < ")):
            if getattr(bound, attr, None) is not None:
                low = text.format(getattr(bound, attr))
        for attr, text in (("le", " <= {}"), ("lt", " < {}")):
            if getattr(bound, attr, None) is not None:
                high = text.format(getattr(bound, attr))
    if low and not high:  # "value > 20" reads better than "20 < value"
        number, sign = low.split()
        return f"value {'>=' if sign == '<=' else '>'} {number}"
    return f"{low}value{high}" if low or high else ""


def _did_you_mean(name: str, candidates: list[str]) -> str:
    """A suggestion for an unknown key: a close sibling, else the same name elsewhere in the tree."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}? "
    elsewhere = [".".join(path) for path in _field_paths() if path[-1] == name]
    return f"did you mean {elsewhere[0]!r} (it belongs in another section)? " if elsewhere else ""


def _problems_from_validation(error: ValidationError, origin_of: Mapping[str, str]) -> list[ConfigProblem]:
    problems = []
    seen = set()
    for item in error.errors():
        # Union branches add locators like "literal['auto']" or "dict[str,str]"; keep field names only.
        loc = tuple(str(part) for part in item["loc"] if not (isinstance(part, str) and "[" in part))
        path = ".".join(loc)
        kind = item["type"]
        if kind == "extra_forbidden":
            parent = _model_at(loc[:-1])
            known = list(parent.model_fields) if parent else []
            allowed = f"unknown key; {_did_you_mean(loc[-1], known)}allowed keys here: {', '.join(known)}"
            if path in REMOVED_FIELDS:
                allowed = f"removed (it did nothing: {REMOVED_FIELDS[path]}); delete it from the file"
        elif kind == "literal_error":
            allowed = f"allowed: {item['ctx']['expected']}"
        elif kind == "value_error":
            allowed = str(item["ctx"]["error"])
        elif kind == "missing":
            allowed = "this field is required"
        elif kind in _BOUND_ERRORS and _bounds_text(loc):
            allowed = f"allowed: {_bounds_text(loc)}"
        elif kind in _TYPE_NAMES:
            allowed = f"expected {_TYPE_NAMES[kind]}"
        else:
            allowed = f"allowed: {item['msg'][0].lower()}{item['msg'][1:]}"
            allowed = allowed.replace("allowed: input should be", "expected")
        key = (path, allowed)
        if key in seen:
            continue
        seen.add(key)
        value = item.get("input", _MISSING) if kind != "missing" else _MISSING
        origin = _origin(loc, origin_of)
        problems.append(ConfigProblem(path=path, value=value, allowed=allowed, origin=origin))
    return _merge_union_branches(problems)


def _origin(loc: tuple[str, ...], origin_of: Mapping[str, str]) -> str:
    """The variable that set the field at ``loc`` or a section around it (``H3_MEMORY_SAFETY`` for a
    problem at ``memory_safety.enabled``), else "file"."""
    for depth in range(len(loc), 0, -1):
        origin = origin_of.get(".".join(loc[:depth]))
        if origin:
            return origin
    return "file"


def _merge_union_branches(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    """A field with alternatives (``"auto"`` or a mapping) fails once per alternative: keep the deeper,
    more specific errors when there are any, else join the alternatives into one problem."""
    paths = [problem.path for problem in problems]
    deeper = {p for p in paths if any(other.startswith(p + ".") for other in paths)}
    merged: dict[str, ConfigProblem] = {}
    for problem in problems:
        if problem.path in deeper and problem.path:
            continue
        if problem.path in merged:
            first = merged[problem.path]
            alternatives = problem.allowed.replace("allowed: ", "").replace("expected ", "")
            merged[problem.path] = ConfigProblem(first.path, first.value, f"{first.allowed} or {alternatives}",
                                                 first.origin)
        else:
            merged[problem.path] = problem
    return list(merged.values())


# ---------------------------------------------------------------------------------------------
# YAML reading (untrusted input: size limit, safe loader, no aliases, no duplicate keys)


class _StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (no "billion laughs") and duplicate keys (no silent overwrite)."""

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not allowed in a config file", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: ANN001
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _too_large(source: str, shown: str) -> ConfigValidationError:
    return ConfigValidationError(source, [ConfigProblem("", shown, f"a config file is at most {MAX_CONFIG_BYTES} bytes")])


def parse_yaml_text(text: str, source: str) -> dict[str, Any]:
    """Parse config text into a mapping (empty text -> ``{}``); raises `ConfigValidationError`."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise _too_large(source, f"<{len(text)} characters>")
    try:
        data = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigValidationError(source, [ConfigProblem("", _MISSING, f"not valid YAML: {where}{reason}")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigValidationError(
            source, [ConfigProblem("", data, f"the top level must be a mapping of fields, got {type(data).__name__}")]
        )
    return data


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in the YAML file at `path`, its size checked against `MAX_CONFIG_BYTES` (bytes) before
    it is read. Raises `ConfigError` when it cannot be read or is not a file, `ConfigValidationError` when
    it is too large, not UTF-8 or not valid YAML."""
    path = Path(path)
    source = str(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"cannot read config file {source}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise ConfigError(f"config path {source} is not a file")
    if size > MAX_CONFIG_BYTES:
        raise _too_large(source, f"<{size} bytes>")
    with open(path, "rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigValidationError(source, [ConfigProblem("", _MISSING, f"not UTF-8 text ({exc.reason} at byte {exc.start})")]) from None
    return parse_yaml_text(text, source)


# ---------------------------------------------------------------------------------------------
# Environment overrides


def _field_paths(model: type[BaseModel] = H3Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name in model.model_fields:
        path = prefix + (name,)
        paths.append(path)
        sub = _model_at(path)
        if sub is not None:
            paths.extend(_field_paths(sub, path))
    return paths


def env_name(path: tuple[str, ...] | str) -> str:
    """``("memory_safety", "max_gpu_memory_mb")`` -> ``"H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB"``."""
    parts = path.split(".") if isinstance(path, str) else path
    return ENV_PREFIX + "__".join(part.upper() for part in parts)


def _env_overrides(
    env: Mapping[str, str],
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any], list[ConfigProblem]]:
    """Nested overrides from ``H3_...`` variables, the variable behind each field path, each applied
    variable's parsed value (``{"H3_NAME": value}``), and problems."""
    known = {env_name(path): path for path in _field_paths()}
    top_level = set(H3Config.model_fields)
    overrides: dict[str, Any] = {}
    origin_of: dict[str, str] = {}
    applied: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_CONFIG:
            continue
        value = env[name]
        path = known.get(name)
        if path is None:
            parts = name[len(ENV_PREFIX):].lower().split("__")
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
            if parts[0] in top_level or close:
                hint = f"did you mean {close[0]}? " if close else ""
                allowed = (f"{name} is not a config field; {hint}nested fields are joined with '__', "
                           f"e.g. {env_name(('memory_safety', 'max_gpu_memory_mb'))}")
            else:
                allowed = (f"{name} is neither a config field nor one of h3director's own switches "
                           f"({', '.join(sorted(ENV_NOT_CONFIG))}); unset it (a config field's variable is H3_ + its "
                           f"name in capitals, sections joined with '__': "
                           f"{env_name(('memory_safety', 'max_gpu_memory_mb'))})")
            problems.append(ConfigProblem(".".join(parts), value, allowed, origin=name))
            continue
        if len(value) > MAX_ENV_VALUE_CHARS:
            problems.append(ConfigProblem(".".join(path), f"<{len(value)} characters>",
                                          f"an override is at most {MAX_ENV_VALUE_CHARS} characters", origin=name))
            continue
        try:
            parsed = yaml.load(value, Loader=_StrictSafeLoader) if value.strip() else None  # noqa: S506
        except yaml.YAMLError as exc:
            problems.append(ConfigProblem(".".join(path), value, f"not a YAML value: {exc}", origin=name))
            continue
        target = overrides
        for depth, part in enumerate(path[:-1]):
            target = target.setdefault(part, {})
            if not isinstance(target, dict):  # a whole-section variable set it to a scalar
                section = ".".join(path[:depth + 1])
                problems.append(ConfigProblem(".".join(path), value,
                                              f"{origin_of.get(section, section)} already sets {section} to "
                                              f"{target!r}, which has no fields", origin=name))
                break
        if isinstance(target, dict):
            target[path[-1]] = parsed
            origin_of[".".join(path)] = name
            applied[name] = parsed
    return overrides, origin_of, applied, problems


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ---------------------------------------------------------------------------------------------
# Public entry points


def default_config_path() -> Path:
    """The packaged default ``h3director/h3_config.yaml``."""
    return Path(str(resources.files("h3director").joinpath(DEFAULT_CONFIG_NAME)))


def find_config_path(path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None) -> Path:
    """The file `load_config` would read: explicit path, $H3_CONFIG, ./h3_config.yaml, packaged default."""
    env = os.environ if env is None else env
    if path is not None:
        return Path(path)
    if env.get("H3_CONFIG"):
        return Path(env["H3_CONFIG"])
    local = Path.cwd() / DEFAULT_CONFIG_NAME
    if local.is_file():
        return local
    return default_config_path()


def validate_config(data: Mapping[str, Any], *, source: str = "<mapping>",
                    env: Mapping[str, str] | None = None) -> H3Config:
    """Validate a mapping (plus ``H3_...`` overrides from ``env``, none when omitted) into `H3Config`.
    `source` names where the mapping came from, in messages. Raises `ConfigValidationError` listing every
    problem."""
    overrides, origin_of, applied, problems = _env_overrides(env or {})
    merged = _merge(dict(data), overrides)
    config = None
    try:
        config = H3Config.model_validate(merged)
    except ValidationError as exc:
        problems = _problems_from_validation(exc, origin_of) + problems
    if problems:
        raise ConfigValidationError(source, problems)
    assert config is not None
    config._source = source
    config._env_overrides = applied
    return config


def load_config(path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None) -> H3Config:
    """The validated `H3Config` from `path` (None: the file `find_config_path` picks), with the `H3_...`
    overrides in `env` (default `os.environ`; `{}` ignores the environment) applied. Raises `ConfigError`
    (a `ConfigValidationError` listing every problem when the content is wrong).
    """
    env = os.environ if env is None else env
    chosen = find_config_path(path, env=env)
    data = read_config_file(chosen)
    return validate_config(data, source=str(chosen), env=env)


__all__ = ["ENV_NOT_CONFIG", "MAX_CONFIG_BYTES", "Allocator", "ConfigProblem", "ConfigValidationError",
           "Features", "H3Config", "MemorySafety", "MonitorSettings", "VideoDecode", "default_config_path",
           "env_name", "find_config_path", "load_config", "read_config_file", "validate_config"]
