"""The values a run config may ask for: the largest (a typo such as an extra three zeros), the finite-number rule
(`.nan`) and each key's valid range or choices. Each check returns the first problem as one message, which
config.parse raises, so a bad value is refused when the config is read rather than found after minutes of silence
(docs/edges.md, Limits)."""
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
LEARN_FROM = ("same_kind", "any")   # search.learn_from: whose earlier runs a run learns from
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


def out_of_range(cfg: Any) -> str | None:
    """The first value of a built RunConfig outside its valid range or choices, as one message, or None."""
    s = cfg.search
    positive = {"search.population": s.population, "search.generations": s.generations,
                "search.tournament_size": s.tournament_size, "search.hall_of_fame": s.hall_of_fame}
    for key, value in positive.items():
        if value < 1:
            return f"config key '{key}' must be >= 1, got {value}"
    if s.finalists < 0:
        return f"config key 'search.finalists' must be >= 0, got {s.finalists}"
    if not 0 <= s.elitism <= s.population:
        return f"config key 'search.elitism' must be between 0 and search.population, got {s.elitism}"
    if not 0.0 <= s.init_random <= 1.0:
        return f"config key 'search.init_random' must be between 0 and 1, got {s.init_random}"
    if s.wall_clock_s is not None and s.wall_clock_s < 0:   # 0: stop after the first generation
        return f"config key 'search.wall_clock_s' must be >= 0 (or null for no limit), got {s.wall_clock_s}"
    if s.max_evaluations is not None and s.max_evaluations < 1:
        return f"config key 'search.max_evaluations' must be >= 1, got {s.max_evaluations}"
    if sum(op.weight for op in s.operators.values()) <= 0:
        return "config key 'search.operators': at least one operator needs a weight > 0"
    if s.policy not in ("static", "bandit"):
        return f"config key 'search.policy' must be one of static, bandit; got {s.policy!r}"
    if s.surrogate.oversample < 1.0 or not 0.0 <= s.surrogate.explore <= 1.0:
        return ("config keys 'search.surrogate.oversample' must be >= 1 and 'search.surrogate.explore' "
                f"in [0, 1]; got {s.surrogate.oversample}, {s.surrogate.explore}")
    r = s.racing
    if r.cases < 1 or r.top_k < 1 or r.warmup < 2 or not 0.5 <= r.confidence < 1.0:
        return ("config keys 'search.racing.cases' and 'search.racing.top_k' must be >= 1, "
                "'search.racing.warmup' >= 2 and 'search.racing.confidence' in [0.5, 1); got "
                f"{r.cases}, {r.top_k}, {r.warmup}, {r.confidence}")
    if s.warm_start.count < 0:
        return f"config key 'search.warm_start.count' must be >= 0, got {s.warm_start.count}"
    if s.learn_from not in LEARN_FROM:
        return (f"config key 'search.learn_from' must be one of {', '.join(LEARN_FROM)}; "
                f"got {s.learn_from!r}")
    found = _workers(cfg) or _workload(cfg.workload)
    if found:
        return found
    for key in ("target_fitness", "patience", "wall_clock_s", "gpu_s"):
        value = getattr(cfg.stop, key)
        if value is not None and value <= 0:
            return f"config key 'stop.{key}' must be > 0 (or null for no limit), got {value}"
    if cfg.evaluator.kind not in ("auto", "gpu", "replay"):
        return f"config key 'evaluator.kind' must be one of auto, gpu, replay; got {cfg.evaluator.kind!r}"
    return None


def _workers(cfg: Any) -> str | None:
    w = cfg.workers
    if cfg.search.mode not in ("generational", "steady"):
        return f"config key 'search.mode' must be one of generational, steady; got {cfg.search.mode!r}"
    if w.backend not in ("inline", "local", "ray"):
        return f"config key 'workers.backend' must be one of inline, local, ray; got {w.backend!r}"
    if isinstance(w.gpus, str) and w.gpus != "all" or isinstance(w.gpus, tuple) and (
            not w.gpus or min(w.gpus) < 0 or len(set(w.gpus)) != len(w.gpus)):
        return (f"config key 'workers.gpus' must be all or a list of distinct device indices >= 0; "
                f"got {w.gpus!r}")
    for key in ("count", "queue_depth", "in_flight"):
        if getattr(w, key) < 0:
            return f"config key 'workers.{key}' must be >= 0, got {getattr(w, key)}"
    if w.llm_concurrency < 1 or w.time_scale < 0:
        return (f"config keys 'workers.llm_concurrency' must be >= 1 and 'workers.time_scale' >= 0; got "
                f"{w.llm_concurrency}, {w.time_scale}")
    return None


RULES = ("tree", "near", "auto")   # a workload campaign's dispatch learners (evo/tools/workload.py)


def _workload(w: Any) -> str | None:
    if w is None:
        return None
    for key in ("train", "heldout", "per_bucket", "panel", "rule_depth"):
        if getattr(w, key) < 1:
            return f"config key 'workload.{key}' must be >= 1, got {getattr(w, key)}"
    if w.rule not in RULES:
        return f"config key 'workload.rule' must be one of {', '.join(RULES)}, got {w.rule!r}"
    if w.search_s is not None and w.search_s <= 0:
        return f"config key 'workload.search_s' must be > 0 (or null for no limit), got {w.search_s}"
    if w.neighbours < 0:
        return f"config key 'workload.neighbours' must be >= 0, got {w.neighbours}"
    for key in ("m", "n"):
        value = getattr(w, key)
        if value is not None and (len(value) != 2 or not 1 <= value[0] <= value[1]):
            return (f"config key 'workload.{key}' must be [low, high] with 1 <= low <= high, got "
                    f"{list(value)}")
    return None
