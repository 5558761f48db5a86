"""The largest values a run config may ask for, and the finite-number rule: a typo such as an extra three zeros, or
`.nan`, is refused when the config is read rather than found after minutes of silence (docs/edges.md, Limits)."""
from __future__ import annotations

import math
from typing import Any, Mapping

# Key -> the largest value it may take. Each is far above any run we make, and low enough that the run still starts
# at once and its journal, table and lineage stay a manageable size.
LIMITS: Mapping[str, int] = {
    "search.population": 10_000,
    "search.generations": 100_000,
    "search.max_evaluations": 1_000_000,
    "search.tournament_size": 10_000,
    "search.elitism": 10_000,
    "search.hall_of_fame": 1_000,
    "search.finalists": 100,
    "search.warm_start.count": 10_000,
    "search.surrogate.min_history": 1_000_000,
    "stop.patience": 100_000,
    "workers.count": 1_024,
    "workers.queue_depth": 10_000,
    "workers.in_flight": 10_000,
    "workers.llm_concurrency": 256,
    "workload.train": 10_000,
    "workload.heldout": 10_000,
    "workload.per_bucket": 100_000,
    "workload.panel": 1_000,
    "workload.rule_depth": 32,
    "workload.neighbours": 1_000,
}
MAX_SHAPES = 1_024        # shapes listed in `shapes` ("MxN,MxN,..."), and case keys
MAX_DIM = 1 << 31         # one size of a listed shape
MAX_DTYPES = 16           # entries of `dtypes`
MAX_EXPERIMENT_NAME = 500   # MLflow's own limit, checked here so that the key is named before any run starts


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        if cfg is None:
            return None
        cfg = getattr(cfg, part)
    return cfg


def over_limit(cfg: Any) -> str | None:
    """The first value of a built RunConfig over its limit, as one message, or None."""
    for key, most in LIMITS.items():
        value = _get(cfg, key)
        if value is not None and value > most:
            return f"config key '{key}' must be at most {most}, got {value}"
    if cfg.dtypes is not None and len(cfg.dtypes) > MAX_DTYPES:
        return f"config key 'dtypes' lists {len(cfg.dtypes)} dtypes; at most {MAX_DTYPES}"
    items = cfg.shapes.split(",")
    if len(items) > MAX_SHAPES:
        return f"config key 'shapes' lists {len(items)} shapes; at most {MAX_SHAPES}"
    for item in items:
        sizes = item.rpartition(":")[2].lower().split("x")
        if any(s.strip().isdigit() and int(s) > MAX_DIM for s in sizes):
            return f"config key 'shapes': {item.strip()!r} has a size over {MAX_DIM}"
    name = cfg.tracking.experiment
    if name is not None and len(name) > MAX_EXPERIMENT_NAME:
        return f"config key 'tracking.experiment' is {len(name)} characters long; at most {MAX_EXPERIMENT_NAME}"
    for key in ("m", "n"):   # a workload's row and width ranges: the same cap as a listed shape's sizes
        bounds = getattr(cfg.workload, key, None)
        if bounds and max(bounds) > MAX_DIM:
            return f"config key 'workload.{key}' must stay at most {MAX_DIM}, got {list(bounds)}"
    return None


def non_finite(data: Any, where: str = "") -> str | None:
    """The first NaN or infinity anywhere in plain config data, as one message naming its key, or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"config key '{where}' must be a finite number, got {data}"
    children: Any = ()
    if isinstance(data, Mapping):
        children = ((f"{where}.{k}" if where else str(k), v) for k, v in data.items())
    elif isinstance(data, (list, tuple)):
        children = ((f"{where}[{i}]", v) for i, v in enumerate(data))
    for key, value in children:
        found = non_finite(value, key)
        if found:
            return found
    return None
