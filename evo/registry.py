"""Plugin discovery through entry points. Built-in plugins are registered in pyproject.toml on the same path
as third-party ones, so a new problem or operator needs no change to evo/."""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUPS = {
    "problem": "kernel_factory.problems",
    "operator": "kernel_factory.operators",
    "evaluator": "kernel_factory.evaluators",
    "observer": "kernel_factory.observers",
}


class PluginError(Exception):
    """A plugin named in a config is unknown or fails to load. The message names it and lists what exists."""


def available(kind: str) -> list[str]:
    return sorted({ep.name for ep in entry_points(group=GROUPS[kind])})


def load(kind: str, name: str) -> Any:
    """The object an entry point names (a Problem instance, or an Operator/Evaluator/Observer class)."""
    matches = [ep for ep in entry_points(group=GROUPS[kind]) if ep.name == name]
    if not matches:
        raise PluginError(f"unknown {kind} {name!r}; installed: {', '.join(available(kind)) or 'none'}")
    try:
        return matches[0].load()
    except Exception as exc:  # a broken third-party plugin must not look like our bug
        raise PluginError(f"{kind} {name!r} failed to load from {matches[0].value}: {exc!r}") from exc
