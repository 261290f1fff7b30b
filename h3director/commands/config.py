"""`h3director config check FILE` and `h3director config show`: validate or print the configuration."""

from __future__ import annotations

import argparse
import json
import os

from h3director.core.config import (
    ConfigValidationError,
    load_config,
    read_config_file,
    validate_config,
)

HELP = "Check an h3_config.yaml (every problem listed) or show the effective configuration."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director config`'s options to `parser` (its argparse sub-parser)."""
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate FILE; print OK and the expanded features, or every problem")
    check.add_argument("file", help="path of the YAML file to check")
    check.add_argument("--no-env", action="store_true", help="ignore H3_... environment overrides")
    show = actions.add_parser("show", help="print the effective configuration (file + environment) as YAML")
    show.add_argument("--config", default=None, help="config file (default: $H3_CONFIG, ./h3_config.yaml, packaged)")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")


def _features_lines(config) -> list[str]:
    features = config.features()
    return [f"  {name:<26} {'on' if value else 'off'}" for name, value in features.__dict__.items()]


def _overrides(config) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in config.env_overrides.items())


def run(args: argparse.Namespace) -> int:
    """Check a config file or show the effective configuration; returns 0, or 1 when `check` finds problems
    (each one printed). Raises `ConfigError` when `show`'s configuration does not validate."""
    if args.config_action == "check":
        env = {} if args.no_env else os.environ
        try:
            config = validate_config(read_config_file(args.file), source=args.file, env=env)
        except ConfigValidationError as exc:
            print(exc)
            return 1
        print(f"OK: {args.file} (memory_optimization_level {config.memory_optimization_level})")
        if config.env_overrides:
            print(f"environment overrides: {_overrides(config)}")
        print("features:")
        print("\n".join(_features_lines(config)))
        for note in config.notes():
            print(f"note: {note}")
        return 0

    config = load_config(args.config)
    if args.json:
        print(json.dumps({"source": config.source, "env_overrides": config.env_overrides,
                          "config": config.model_dump(mode="json"),
                          "features": config.features().__dict__}, indent=2))
        return 0
    print(f"# source: {config.source}")
    if config.env_overrides:
        print(f"# environment overrides: {_overrides(config)}")
    print("# features: " + (", ".join(config.features().enabled()) or "none"))
    print(config.to_yaml(), end="")
    return 0


__all__ = ["HELP", "add_arguments", "run"]
