"""`h3director doctor [--json]`: the environment as a table, with concrete warnings."""

from __future__ import annotations

import argparse
import json

from h3director.units import format_size

HELP = ("Show torch build, devices and free memory, allocator, native core, active config, NVML, NVIDIA driver and "
        "CUDA versions, and warnings.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director doctor`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--config", default=None, help="config file (default: $H3_CONFIG, ./h3_config.yaml, packaged)")


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def format_environment(env) -> str:
    rows = [
        ("h3director", env.h3director),
        ("python", f"{env.python} ({env.platform})"),
        ("torch", f"{env.torch} ({env.build} build)"),
    ]
    for device in env.devices:
        memory = "memory unknown"
        if device.total_bytes is not None:
            free = "?" if device.free_bytes is None else format_size(device.free_bytes)
            memory = f"{format_size(device.total_bytes)} total, {free} free"
        note = f" [{device.note}]" if device.note else ""
        rows.append((f"device {device.device}", f"{device.name}: {memory}{note}"))
    rows.append(("allocator backend", env.allocator_backend or "n/a (no CUDA)"))
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        rows.append((name, env.alloc_conf.get(name, "(not set)")))
    rows.append(("native core", env.native_core))
    level = "invalid" if env.config_problems else str(env.config_level)
    rows.append(("config", env.config_path))
    rows.append(("memory level", level))
    rows.append(("features", ", ".join(env.features) or "none"))
    rows.extend(("what runs" if index == 0 else "", effect) for index, effect in enumerate(env.level_effects))
    rows.append(("NVML", env.nvml))
    if env.driver is not None:
        from h3director.core.driver_gate import driver_lines

        rows.extend(driver_lines(env.driver))
    rows.append(("packages", ", ".join(f"{k} {v}" if v else f"{k} -" for k, v in env.packages.items())))
    text = _table(rows)
    for problem in env.config_problems:
        text += f"\nconfig problem: {problem}"
    if env.warnings:
        text += "\n\nwarnings:\n" + "\n".join(f"  - {warning}" for warning in env.warnings)
    else:
        text += "\n\nwarnings: none"
    return text


def run(args: argparse.Namespace) -> int:
    """Print this machine's environment (a table, or JSON with `--json`) and its warnings; returns 0."""
    from h3director.core.environment import collect

    env = collect(args.config)
    if args.json:
        print(json.dumps(env.to_dict(), indent=2))
    else:
        print(format_environment(env))
    return 0


__all__ = ["HELP", "add_arguments", "run"]
