"""Exception hierarchy shared by every layer.

Every refusal H3 Director makes derives from `H3DirectorError`, so a caller (the CLI, a ComfyUI
node) can show the message as it is, without a traceback. Messages say what was expected and
what came.
"""


class H3DirectorError(Exception):
    """Base class of every error H3 Director raises on purpose."""


class InvalidInputError(H3DirectorError, ValueError):
    """An input (tensor, file, argument) is malformed; raised before any expensive work starts."""


class ConfigError(H3DirectorError, ValueError):
    """`h3_config.yaml` or an `H3_...` environment override is invalid."""


class BudgetError(H3DirectorError):
    """A job cannot fit the configured memory budget; the message names the setting that would fix it."""
