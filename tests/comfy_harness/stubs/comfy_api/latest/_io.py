"""Stand-in for `comfy_api/latest/_io.py` (see the package docstring for what it mirrors)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class FolderType(str, Enum):
    input = "input"
    output = "output"
    temp = "temp"


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"


class Input:
    def __init__(self, id: str, display_name: str = None, optional=False, tooltip: str = None, lazy: bool = None,
                 extra_dict=None, raw_link: bool = None, advanced: bool = None):
        self.id, self.display_name, self.optional, self.tooltip = id, display_name, optional, tooltip
        self.lazy, self.extra_dict = lazy, extra_dict or {}

    def validate(self):
        pass


class WidgetInput(Input):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                 socketless=None, widget_type=None, force_input=None, extra_dict=None, raw_link=None, advanced=None):
        super().__init__(id, display_name, optional, tooltip, lazy, extra_dict, raw_link, advanced)
        self.default = default


class Output:
    def __init__(self, id: str = None, display_name: str = None, tooltip: str = None, is_output_list=False):
        self.id, self.display_name, self.tooltip, self.is_output_list = id, display_name or id, tooltip, is_output_list

    def validate(self):
        pass


def _comfytype(io_type: str, python_type: Any = Any, input_base=Input):
    class _Input(input_base):
        pass

    class _Output(Output):
        pass

    cls = type(io_type.title(), (), {"io_type": io_type, "Type": python_type, "Input": _Input, "Output": _Output})
    _Input.Parent = _Output.Parent = cls
    _Input.io_type = _Output.io_type = io_type
    return cls


class _NumberInput(WidgetInput):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None, min=None,
                 max=None, step=None, round=None, display_mode=None, control_after_generate=None, socketless=None,
                 force_input=None, extra_dict=None, raw_link=None, advanced=None):
        super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input, extra_dict)
        self.min, self.max, self.step = min, max, step


class _StringInput(WidgetInput):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, multiline=False,
                 placeholder=None, default=None, dynamic_prompts=None, socketless=None, force_input=None,
                 extra_dict=None, raw_link=None, advanced=None):
        super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input, extra_dict)
        self.multiline = multiline


class _BooleanInput(WidgetInput):
    def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                 label_on=None, label_off=None, socketless=None, force_input=None, extra_dict=None,
                 raw_link=None, advanced=None):
        super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input, extra_dict)


class _ComboInput(WidgetInput):
    def __init__(self, id, options=None, display_name=None, optional=False, tooltip=None, lazy=None,
                 default=None, control_after_generate=None, upload=None, image_folder=None, remote=None,
                 socketless=None, extra_dict=None, raw_link=None, advanced=None):
        if isinstance(options, type) and issubclass(options, Enum):
            options = [v.value for v in options]
        super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, None, extra_dict)
        self.options = options


Int = _comfytype("INT", int, _NumberInput)
Float = _comfytype("FLOAT", float, _NumberInput)
String = _comfytype("STRING", str, _StringInput)
Boolean = _comfytype("BOOLEAN", bool, _BooleanInput)
Combo = _comfytype("COMBO", str, _ComboInput)
Image = _comfytype("IMAGE")
Latent = _comfytype("LATENT")
Vae = _comfytype("VAE")
Model = _comfytype("MODEL")
Audio = _comfytype("AUDIO")
UpscaleModel = _comfytype("UPSCALE_MODEL")
Conditioning = _comfytype("CONDITIONING")
Clip = _comfytype("CLIP")
Sampler = _comfytype("SAMPLER")
AnyType = _comfytype("*")


def Custom(io_type: str):
    """Mirrors `io.Custom(io_type)`: a new ComfyType with Input and Output."""
    return _comfytype(io_type)


class HiddenHolder:
    def __init__(self, values: dict | None = None):
        self._values = {Hidden(k) if not isinstance(k, Hidden) else k: v for k, v in (values or {}).items()}

    def __getattr__(self, key: str):
        if key.startswith("_"):
            raise AttributeError(key)
        return self._values.get(Hidden[key])


@dataclass
class Schema:
    node_id: str
    display_name: str = None
    category: str = "sd"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    description: str = ""
    search_aliases: list = field(default_factory=list)
    is_input_list: bool = False
    is_output_node: bool = False
    is_deprecated: bool = False
    is_experimental: bool = False
    is_dev_only: bool = False
    is_api_node: bool = False
    not_idempotent: bool = False
    enable_expand: bool = False
    accept_all_inputs: bool = False
    essentials_category: str | None = None
    has_intermediate_output: bool = False

    def validate(self):
        """Mirrors `Schema.validate`: input ids and output ids must be unique."""
        input_ids = [i.id for i in self.inputs]
        output_ids = [o.id for o in self.outputs]
        issues = []
        if len(set(input_ids)) != len(input_ids):
            issues.append(f"Input ids must be unique, but {[i for i, c in Counter(input_ids).items() if c > 1]} are not.")
        if len(set(output_ids)) != len(output_ids):
            issues.append(f"Output ids must be unique, but {[i for i, c in Counter(output_ids).items() if c > 1]} are not.")
        if issues:
            raise ValueError("\n".join(issues))

    def finalize(self):
        """Mirrors `Schema.finalize`: output nodes get prompt/extra_pnginfo, outputs get default ids."""
        if self.is_output_node:
            for hidden in (Hidden.prompt, Hidden.extra_pnginfo):
                if hidden not in self.hidden:
                    self.hidden.append(hidden)
        for i, output in enumerate(self.outputs):
            if output.id is None:
                output.id = f"_{i}_{output.io_type}_"


class NodeOutput:
    def __init__(self, *args: Any, ui=None, expand: dict = None, block_execution: str = None):
        self.args, self.ui, self.expand, self.block_execution = args, ui, expand, block_execution

    @property
    def result(self):
        return self.args if len(self.args) > 0 else None

    def __getitem__(self, index):
        return self.args[index]


class ComfyNode:
    """Mirrors `io.ComfyNode`: classmethods only; `hidden` is set per execution by the executor."""

    hidden: HiddenHolder = HiddenHolder()

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError

    @classmethod
    def execute(cls, **kwargs) -> NodeOutput:
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls) -> Schema:
        schema = cls.define_schema()
        schema.finalize()
        schema.validate()
        return schema
