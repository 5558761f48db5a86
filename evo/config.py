"""Strict YAML run configs: frozen dataclasses, every default in one place, unknown keys and wrong types rejected
with a message that names the key and what would be valid. Overrides (`-o search.population=8`) go through the
same checks."""
from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


from . import limits, yamltext


class ConfigError(Exception):
    """Bad configuration: raised before anything is compiled or any GPU is touched."""


@dataclass(frozen=True)
class OperatorConfig:
    weight: float = 1.0                                  # relative probability of making a child with it
    options: Mapping[str, Any] = field(default_factory=dict)  # passed to the operator's constructor


@dataclass(frozen=True)
class SurrogateConfig:
    # On by default, with 8 bootstrap members and an upper-confidence pick (issue 32): with it at population 8, the
    # default loop needed a median 43.5 evaluations to target on seeds 0-19 of the in-sample RMSNorm bf16 recording,
    # against 71 with the earlier defaults (population 12, surrogate off; one-sided Mann-Whitney p = 0.03); on 40
    # seeds 36.5 against 69, and 45.5-46.5 with one ridge model or kappa 0. The efficiency reports' loop-before row
    # runs the earlier defaults (docs/results/efficiency/; docs/learning.md quotes them).
    enabled: bool = True
    oversample: float = 4.0        # children proposed per child sent to the evaluator
    explore: float = 0.1           # share of each batch drawn at random from the proposals, not by rank
    min_history: int = 8           # successful evaluations needed before the model is trusted
    members: int = 8               # ridge models, each on a bootstrap resample of the history (1: one on all of it)
    kappa: float = 0.5             # the pick's upper confidence: predicted log fitness + kappa x the members' spread


@dataclass(frozen=True)
class RacingConfig:
    """Racing (docs/racing.md): every candidate is gated in full; it is timed first on the `cases` cheapest benchmark
    cases (fewest bytes moved), and cut when even the optimistic bound on its full fitness (one-sided, at
    `confidence`: its partial fitness, corrected by how the cheap cases mislead on the fully timed candidates so far,
    with their spread and the candidate's own timing noise) stays below the `top_k`-th best full fitness. Nothing is
    cut before `warmup` candidates were timed in full. Survivors are timed on every case."""
    # Off by default: a cut candidate has no fitness, so turning it on changes what the existing replay tests, the
    # quickstart's replay and the published search-efficiency figures measure (they count fully timed candidates).
    enabled: bool = False
    # 6 of the 11 rows and 0.95: the same final best as full timing on 5 of 5 seeds of the quickstart's H200
    # recording and of the synthetic one, with the most candidates per GPU-minute of the settings compared
    # (3 or 6 cases, 0.9 to 0.99; docs/racing.md)
    cases: int = 6                 # benchmark cases timed first (the cheapest: fewest bytes moved)
    top_k: int = 3                 # the running top-k a candidate must be able to reach; none is cut before k exist
    confidence: float = 0.95       # one-sided: a cut candidate's full fitness is below the threshold at this confidence
    warmup: int = 12               # candidates timed in full before any cut (they calibrate the bound)


@dataclass(frozen=True)
class WarmStartConfig:
    enabled: bool = True           # seed the first population from earlier runs of the same problem and GPU
    count: int = 8                 # at most this many distinct genomes


@dataclass(frozen=True)
class SearchConfig:
    population: int = 8                   # small batches let what was learned steer the next one sooner
    generations: int = 8
    max_evaluations: int | None = None    # stop once this many candidates were evaluated (None: no limit)
    wall_clock_s: float | None = None     # stop after this many seconds (None: no limit)
    tournament_size: int = 3
    elitism: int = 2                      # best candidates always kept in the next population
    hall_of_fame: int = 5
    per_case_elites: bool = False         # also keep the fastest candidate of every benchmark case (per-shape search)
    finalists: int = 3                    # hall-of-fame members re-timed at the end, interleaved with the baseline
    seeds_from: str | None = None         # a dispatch table (kernel-factory export): its genomes join generation 0
    # Gene choices this run may take, a subset of the problem's per gene (e.g. {stages: [2, 3, 4]}): a run that
    # explores one template variant in depth. Genes not named keep all their choices.
    space: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    init_random: float = 1.0              # share of the first population drawn at random (rest: template defaults)
    # "generational" (a whole population per step) or "steady" (asynchronous: a child is bred as soon as a slot of
    # workers.in_flight frees, and replaces the worst; no generation waits for its slowest candidate or LLM reply)
    mode: str = "generational"
    policy: str = "bandit"                # operator choice: "static" (config weights) or "bandit" (UCB1 on credit)
    lessons: bool = True                  # forbid or down-weight gene values that history shows fail or never help
    surrogate: SurrogateConfig = field(default_factory=SurrogateConfig)
    racing: RacingConfig = field(default_factory=RacingConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    # Which earlier runs teach this one (warm start, credit, lessons, surrogate): "same_kind" -- live runs learn
    # from live runs on the same GPU model, replays from replays of the same recording; "any": both kinds.
    learn_from: str = "same_kind"
    operators: Mapping[str, OperatorConfig] = field(default_factory=lambda: {
        "gene_mutation": OperatorConfig(0.5),
        "uniform_crossover": OperatorConfig(0.3),
        "ptx_mutation": OperatorConfig(0.2),
    })


@dataclass(frozen=True)
class EvaluatorConfig:
    kind: str = "auto"                    # auto (gpu when one is found, else replay), gpu or replay
    baseline: str | None = None           # fitness = geomean(baseline / candidate); None: the problem's default
    gpu: Mapping[str, Any] = field(default_factory=dict)     # options for the gpu evaluator
    replay: Mapping[str, Any] = field(default_factory=dict)  # options for the replay evaluator


@dataclass(frozen=True)
class WorkersConfig:
    """Where candidates are timed: `inline` (one GPU worker, driven by the loop), `local` (one worker process per
    GPU of this host) or `ray` (one Ray actor per GPU of a cluster). See docs/scale-out.md."""
    backend: str = "inline"
    gpus: str | tuple[int, ...] = "all"   # local: "all" or a list of device indices
    address: str = "auto"                 # ray: the cluster to join (ray.init(address=...))
    count: int = 0                        # replay: workers to simulate with the recording's latencies (0: none)
    time_scale: float = 1.0               # replay: a simulated worker holds each candidate recorded gpu_s x this
    queue_depth: int = 0                  # compiled candidates ready ahead of the workers (0: two per worker)
    in_flight: int = 0                    # search.mode steady: children bred or timed at once (0: the population)
    llm_concurrency: int = 4              # search.mode steady: LLM operator calls at once


@dataclass(frozen=True)
class TrackingConfig:
    store: str = "runs/mlflow.db"         # MLflow SQLite file
    artifacts: str = "runs/artifacts"     # MLflow artifact root (fixed when an experiment is created)
    experiment: str | None = None         # None: the problem's name
    # Any MLflow tracking URI (a tracking server, another database). None: MLFLOW_TRACKING_URI if set, else the
    # SQLite file `store`.
    uri: str | None = None
    optional: bool = False                # a store that cannot be written: warn and go on with the journal only
    child_runs: bool = False              # also one MLflow run per candidate (the candidate table is always there)


@dataclass(frozen=True)
class StopConfig:
    """Rules that end a run early; the first that holds after a generation stops it, and the summary names it."""

    target_fitness: float | None = None   # stop once the best fitness reaches this
    patience: int | None = None           # stop after this many generations without a better best
    wall_clock_s: float | None = None     # stop after this many seconds of wall clock
    gpu_s: float | None = None            # stop after this many GPU-worker seconds spent evaluating


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload campaign (docs/workload.md): the problem's declared workload, narrowed by the keys given here, is
    drawn into a training set and a disjoint held-out set; one search runs per bucket of the training set, warm-
    started from the nearest buckets searched before; the best genomes are timed on every training shape of their
    dtype, and a dispatch rule is learned from those times. The held-out set is only for the validation bench."""
    dtypes: tuple[str, ...] | None = None     # None: the problem's; the others narrow it
    m: tuple[int, ...] | None = None          # [low, high] rows
    n: tuple[int, ...] | None = None          # [low, high] row width
    small_m_share: float | None = None
    laws: Mapping[str, float] = field(default_factory=dict)
    max_bytes: int | None = None              # largest input tensor, bytes
    seed: int = 0                             # draws the sets (independently of `seed`, which drives the search)
    train: int = 48                           # training cases per dtype
    # training cases per dtype beyond `train` (the same seeded stream drawn on): timed in the panels and learned
    # from by the rule, but searched in no bucket (a denser training set for the rule at a panel's cost)
    train_more: int = 0
    heldout: int = 48                         # held-out cases per dtype
    per_bucket: int = 24                      # evaluations of each bucket's search
    search_s: float | None = None             # wall clock for all bucket searches, shared out bucket by bucket
    neighbours: int = 3                       # buckets searched before whose winners seed the next bucket
    panel: int = 24                           # most genomes per dtype timed on every training case
    # Genes are dtype-free: with this, each dtype's panel also times what the other dtypes found (their buckets'
    # best, up to `panel` more, and the genomes panel_from's table runs in them). 2026-12-03: the fp16 panel's best
    # genome at 32768x65536 was not in the bf16 panel, whose best was 13% slower on the same bytes.
    panel_all_dtypes: bool = False
    # An earlier campaign folder (its panel-<dtype>.jsonl or panels.tar.xz; the same held-out draw): the genomes that
    # were fastest on some training shape of its panels join this campaign's panels (of every dtype with
    # panel_all_dtypes), so that a genome a later table dropped is timed again
    panel_winners_from: str | None = None
    # An earlier campaign folder's panels (the same held-out draw): a genome it timed correct keeps its times there
    # and is timed here only on the cases it lacks (with train_more, the new shapes); a campaign cut in its
    # panels goes on from its own folder so
    panel_times_from: str | None = None
    rule_depth: int = 4                       # depth of the learned dispatch tree
    rule: str = "tree"                        # the learned dispatch: tree, near (nearest shapes) or auto (per dtype,
                                              # the better of the two on training cases left out of the learning)
    # Bucket by dtype too (a search per dtype and class), or search each class on all its dtypes' shapes at once
    # (genes are dtype-free; the panel and the rule stay per dtype): a third of the searches.
    bucket_by_dtype: bool = True
    validate: bool = True                     # end with the held-out bench (on a GPU; `kernel-factory heldout` later)
    without: tuple[str, ...] = ()             # declared peers the held-out bench leaves out (its lines say so)
    # A later pass over a finished campaign: skip the bucket searches and take their winners from this campaign folder
    # (its journals/), to re-time and re-learn with more genomes or shapes.
    searched_from: str | None = None
    # Or skip the panels too: learn again from this campaign folder's panels (panel-<dtype>.jsonl, or packed in its
    # panels.tar.xz), on any machine; it must have drawn the same held-out shapes.
    panels_from: str | None = None
    # a dispatch table whose genomes (per dtype) join every panel; each bucket's search starts from the genomes it
    # picks for that bucket's shapes
    panel_from: str | None = None
    # Genes whose best value depends on the shape more than on the rest of the genome (RMSNorm's `tail`: only rows
    # that do not split into whole vectors run it): every panel genome's twin with this value joins the panel, so
    # that the rule can pick either per shape rather than inherit whatever value a bucket's winner happened to carry.
    # (a gene may name several values: a twin for each, `{w_ahead: [l2, regs]}`)
    panel_twins: Mapping[str, Any] = field(default_factory=dict)
    # false: no bucket search at all; the panels hold the genomes of panel_from's table and panel_winners_from's
    # panels, and their twins (a finished campaign learned again once the space has a new gene)
    search: bool = True
    extra_train: str | None = None            # a shape set of the problem the panels and rules also learn from
    buckets: tuple[str, ...] = ()             # only these buckets (empty: every bucket the training set fills)


@dataclass(frozen=True)
class RunConfig:
    problem: str
    dtypes: tuple[str, ...] | None = None   # None: the problem's first dtype
    # a shape set of the problem, or "MxN,MxN" (each in every dtype), or case keys "bfloat16:MxN,float32:MxN"
    shapes: str = "benchmark"
    seed: int = 0
    out_dir: str = "runs"
    observers: tuple[str, ...] = ("console", "journal", "mlflow")
    search: SearchConfig = field(default_factory=SearchConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    workload: WorkloadConfig | None = None  # set: `kernel-factory run` runs a workload campaign (evo/tools/workload)

    def to_json(self) -> dict[str, Any]:
        """Plain data that parse() accepts again (resume re-reads a run's resolved config from its journal)."""
        data = _plain(dataclasses.asdict(self))
        data["search"]["operators"] = {name: {"weight": op.weight, **op.options}
                                       for name, op in self.search.operators.items()}
        return data


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is not None and issubclass(origin, Mapping):
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {type(None): "null", int: "an int", float: "a number", str: "a string", bool: "true/false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp` and convert it (lists to tuples, dicts to dataclasses)."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        others = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is not None and len(others) == 1 and dataclasses.is_dataclass(others[0]):
            return _coerce(value, others[0], where)   # an optional section: its own keys' errors, not "or null"
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(exc)
        raise _type_error(where, tp, value)
    if tp is type(None):
        if value is None:
            return None
        raise _type_error(where, tp, value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise _type_error(where, tp, value)
        return _build(tp, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _type_error(where, tp, value)
        (item_tp, *_) = typing.get_args(tp)
        return tuple(_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            raise _type_error(where, tp, value)
        key_tp, val_tp = typing.get_args(tp)
        return {str(k): _coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, float) and not math.isfinite(value):   # other files (build()) too
        raise ConfigError(f"config key '{where}' must be a finite number, got {value}")
    if tp is int and isinstance(value, bool):
        raise _type_error(where, tp, value)
    if isinstance(value, tp):
        return value
    raise _type_error(where, tp, value)


def _type_error(where: str, tp: Any, value: Any) -> ConfigError:
    return ConfigError(f"config key '{where}' must be {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            scope = f"under '{where}'" if where else "at the top level"
            raise ConfigError(f"config key '{_join(where, key)}' is unknown; valid keys {scope}: "
                              f"{', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            if cls is SearchConfig and name == "operators":
                kwargs[name] = _operators(data[name], _join(where, name))
            else:
                kwargs[name] = _coerce(data[name], hints[name], _join(where, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"config key '{_join(where, name)}' is required")
    return cls(**kwargs)


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """A frozen dataclass from plain data, with the same checks and messages as run configs (other commands' YAML
    files, e.g. the targets of `kernel-factory gap`)."""
    return _build(cls, data, where)


def load_mapping(path: str | Path, what: str = "config file") -> Mapping[str, Any]:
    """A YAML file's top-level mapping, read as strict data (yamltext: UTF-8, size, duplicate keys, aliases), or a
    ConfigError that names the file and the problem."""
    try:
        data = yamltext.read(Path(path))
    except yamltext.YamlTextError as exc:
        raise ConfigError(f"{what} {str(path)!r} {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} {str(path)!r} must hold a mapping at the top level")
    return data


def _operators(data: Any, where: str) -> dict[str, OperatorConfig]:
    """`name: {weight: 0.5, other: ...}`: weight is ours, every other key goes to the operator's constructor."""
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(f"config key '{where}' must be a non-empty mapping of operator name to settings")
    out = {}
    for name, settings in data.items():
        settings = {} if settings is None else settings
        if not isinstance(settings, Mapping):
            raise ConfigError(f"config key '{where}.{name}' must be a mapping, got {settings!r}")
        weight = _coerce(settings.get("weight", 1.0), float, f"{where}.{name}.weight")
        if weight < 0:
            raise ConfigError(f"config key '{where}.{name}.weight' must be >= 0, got {weight}")
        out[str(name)] = OperatorConfig(weight, {k: v for k, v in settings.items() if k != "weight"})
    return out


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else str(key)


def _apply_override(data: dict[str, Any], text: str) -> None:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    path, raw = text.split("=", 1)
    keys = path.strip().split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {text!r}: '{key}' is not a mapping")
    try:
        node[keys[-1]] = yamltext.loads(raw)
    except yamltext.YamlTextError as exc:
        raise ConfigError(f"override {text!r}: the value {exc}") from None


def parse(data: Mapping[str, Any], overrides: tuple[str, ...] = ()) -> RunConfig:
    data = copy.deepcopy(dict(data))   # overrides edit the copy; key order is kept (operator order matters)
    for text in overrides:
        _apply_override(data, text)
    problem = limits.non_finite(data)   # also inside free-form options (evaluator.gpu, operators, space)
    if problem:
        raise ConfigError(problem)
    cfg = _build(RunConfig, data, "")
    problem = limits.out_of_range(cfg)
    if problem:
        raise ConfigError(problem)
    problem = limits.over_limit(cfg)
    if problem:
        raise ConfigError(f"{problem} (docs/edges.md, Limits)")
    return cfg


def load(path: str | Path, overrides: tuple[str, ...] = ()) -> RunConfig:
    return parse(load_mapping(path), overrides)
