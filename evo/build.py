"""The composition root: a validated RunConfig becomes a Problem, operators, an evaluator and observers.

Every check that can fail on bad configuration happens here, before any compile or GPU work, and raises
ConfigError naming the key and what would be valid.
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import registry
from .config import ConfigError, RunConfig
from .protocols import SHAPE_SETS, Evaluator, MaybeUnavailable, Observer, Problem
from .types import Case, GeneSpace
from .variation import WeightedOperator


@dataclass
class Run:
    config: RunConfig
    problem: Problem
    cases: tuple[Case, ...]
    operators: list[WeightedOperator]
    baseline: str


def _plugin(kind: str, name: str, where: str) -> Any:
    try:
        return registry.load(kind, name)
    except registry.PluginError as exc:
        raise ConfigError(f"config key '{where}': {exc}") from exc


def construct(factory: Callable[..., Any], options: Mapping[str, Any], where: str, **fixed: Any) -> Any:
    """Call a plugin's constructor with config options; an unknown option is a ConfigError naming it."""
    check_options(factory, options, where, fixed)
    try:
        return factory(**fixed, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config key '{where}': {exc}") from exc


def check_options(factory: Callable[..., Any], options: Mapping[str, Any], where: str,
                  fixed: Mapping[str, Any] | Sequence[str] = ()) -> None:
    """A ConfigError naming the first option that `factory` does not take (`fixed`: the names the caller fills)."""
    params = inspect.signature(factory).parameters
    accepted = [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY or (n not in fixed and n != "self")]
    for key in options:
        if key not in params or key in fixed:
            raise ConfigError(f"config key '{where}.{key}' is unknown; valid keys under '{where}': "
                              f"{', '.join(accepted) or 'none'}")


def shapes_of(problem: Problem, spec: str, where: str) -> tuple[tuple[int, ...], ...]:
    """A shape set of the problem by name (benchmark, correctness, heldout), or shapes listed as "MxN,MxN" (e.g. a
    search of the widest benchmark rows only). `where` names the setting in errors."""
    if spec in SHAPE_SETS:
        return tuple(tuple(s) for s in problem.shape_sets[spec])
    rank = len(problem.shape_sets["benchmark"][0])
    shapes = []
    for item in str(spec).split(","):
        try:
            shape = tuple(int(v) for v in item.strip().lower().split("x"))
        except ValueError:
            shape = ()
        if len(shape) != rank or min(shape) < 1:
            raise ConfigError(f"{where}: {item.strip()!r} is not a shape; use one of {', '.join(SHAPE_SETS)} or "
                              f"a comma list of {'x'.join('MNK'[:rank])} with positive sizes, e.g. 32768x4096")
        shapes.append(shape)
    return tuple(shapes)


def cases_of(problem: Problem, spec: str, dtypes: Sequence[str]) -> tuple[Case, ...]:
    """The run's cases: each shape of `spec` in each dtype, or, where spec lists case keys ("bfloat16:1x4096,
    float32:5x1024", as a workload bucket does), exactly those cases (their dtypes must be among `dtypes`)."""
    if ":" not in spec:
        return tuple(Case(s, dt) for dt in dtypes for s in shapes_of(problem, spec, "config key 'shapes'"))
    cases = []
    for item in spec.split(","):
        dtype, _, shape = item.strip().partition(":")
        if dtype not in dtypes:
            raise ConfigError(f"config key 'shapes': case {item.strip()!r} has dtype {dtype!r}, not one of the run's "
                              f"dtypes {', '.join(dtypes)}")
        cases += [Case(s, dtype) for s in shapes_of(problem, shape, "config key 'shapes'")]
    return tuple(cases)


def prepare(cfg: RunConfig) -> Run:
    """Resolve the problem, its cases and the operators. Touches no GPU."""
    problem = _plugin("problem", cfg.problem, "problem")
    from .evaluate.render import genes_header_fault
    stale = genes_header_fault(problem)   # else a named choice added since compiles as the gene's first choice
    if stale:
        raise ConfigError(f"problem {problem.name!r}: {stale}")
    dtypes = cfg.dtypes or problem.dtypes[:1]
    for dt in dtypes:
        if dt not in problem.dtypes:
            raise ConfigError(f"config key 'dtypes': {dt!r} is not supported by {problem.name}; "
                              f"choose from {', '.join(problem.dtypes)}")
    cases = cases_of(problem, cfg.shapes, dtypes)
    restrict_space(problem.space, cfg.search.space)   # fails here, before anything runs, if it names bad genes
    baseline = cfg.evaluator.baseline or problem.baselines[0]
    if baseline not in problem.baselines:
        raise ConfigError(f"config key 'evaluator.baseline': {baseline!r} is not a baseline of {problem.name}; "
                          f"choose from {', '.join(problem.baselines)}")
    operators, disabled = [], []
    for name, op_cfg in cfg.search.operators.items():
        where = f"search.operators.{name}"
        op = construct(_plugin("operator", name, where), op_cfg.options, where)
        why = op.unavailable if isinstance(op, MaybeUnavailable) else None   # e.g. an LLM operator, no endpoint
        if why:
            disabled.append(f"{name} ({why})")
        elif op_cfg.weight > 0:
            operators.append(WeightedOperator(op, op_cfg.weight))
    if disabled:
        if not operators:
            raise ConfigError(f"config key 'search.operators': every operator is disabled: {'; '.join(disabled)}")
        print(f"operators disabled: {'; '.join(disabled)}; the run goes on with "
              f"{', '.join(w.operator.name for w in operators)}", file=sys.stderr)
    return Run(cfg, problem, cases, operators, baseline)


def restrict_space(space: GeneSpace, choices: Mapping[str, tuple]) -> GeneSpace:
    """The space a run searches: the problem's (or a recording's), limited to the config's `search.space`."""
    if not choices:
        return space
    for name, values in choices.items():
        where = f"config key 'search.space.{name}'"
        if name not in space.names:
            raise ConfigError(f"{where}: no such gene; the genes are {', '.join(space.names)}")
        bad = [v for v in values if v not in space[name].choices]
        if not values or bad:
            raise ConfigError(f"{where}: {bad or 'an empty list'} not among the choices "
                              f"{', '.join(map(repr, space[name].choices))}")
    narrow = space.restricted(choices)
    if next(narrow.enumerate(), None) is None:
        raise ConfigError(f"config key 'search.space': no genome with these choices passes the problem's rule "
                          f"({dict(choices)})")
    return narrow


def evaluator_kind(cfg: RunConfig) -> tuple[str, str | None]:
    """(kind, reason): 'auto' becomes gpu when a GPU is usable, else replay with the reason there is none. Without a
    GPU, kind gpu, or kind auto with no recording to replay, is a ConfigError that says what to do (raised before any
    run folder is made)."""
    from .evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason() if cfg.evaluator.kind in ("auto", "gpu") else None
    if reason:
        problem = _plugin("problem", cfg.problem, "problem")
        recordings = [cfg.evaluator.replay["recording"]] if cfg.evaluator.replay.get("recording") else \
            _recordings(problem)
        if cfg.evaluator.kind == "gpu" or not recordings:
            raise ConfigError(no_gpu_message(cfg, problem, reason, bool(recordings)))
    if cfg.evaluator.kind == "auto":
        return ("replay", reason) if reason else ("gpu", None)
    return cfg.evaluator.kind, None


def need_gpu(cfg: RunConfig, what: str) -> None:
    """For a command that only measures on a GPU (`record`): a ConfigError unless this machine has one and the config
    lets it use it."""
    if cfg.evaluator.kind == "replay":
        raise ConfigError(f"config key 'evaluator.kind' is 'replay', but {what} measures on a GPU: set it to gpu "
                          "(or auto), e.g. -o evaluator.kind=gpu, and run on a GPU host")
    from .evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        raise ConfigError(f"{what} measures on a GPU, and none was found here ({reason}); run it on a GPU host "
                          "(docs/gpu-host.md)")


def _module_folder(problem: Problem) -> Path | None:
    module = sys.modules.get(type(problem).__module__)
    return Path(module.__file__).resolve().parent if getattr(module, "__file__", None) else None


def _recordings(problem: Problem) -> list[Path]:
    from .evaluate.replay import bundled_recordings
    return bundled_recordings(problem) if _module_folder(problem) is not None else []


def no_gpu_message(cfg: RunConfig, problem: Problem, reason: str, recorded: bool) -> str:
    """Why a run cannot start here: no GPU, and either kind gpu (replay instead, where a recording exists) or no
    recording (how to record one)."""
    if cfg.evaluator.kind == "gpu":
        other = ("; set evaluator.kind: auto (or -o evaluator.kind=replay) to replay its recorded measurements"
                 if recorded else f", and problem {problem.name!r} has no recording to replay")
        return f"config key 'evaluator.kind' is 'gpu', but no GPU was found here ({reason}){other}"
    dtype = (cfg.dtypes or problem.dtypes[:1])[0]
    folder = _module_folder(problem) or Path("<the problem module's folder>")
    return (f"no GPU found ({reason}) and no recording for problem {problem.name!r}; record one on a GPU host with "
            f"`kernel-factory record RECORD_CONFIG --out {folder / 'recorded'}/{problem.name}-{dtype}-<gpu>.jsonl.gz`"
            f" and ship it as package data (docs/adding-a-problem.md, Recordings), or replay one you have with "
            f"-o evaluator.replay.recording=PATH")


def make_evaluator(run: Run, kind: str, race: bool = True) -> Evaluator:
    """The run's evaluator; race=False leaves racing out (a recording needs every case of every genome)."""
    options = run.config.evaluator.gpu if kind == "gpu" else run.config.evaluator.replay
    cls = _plugin("evaluator", kind, "evaluator.kind")
    for other in {"gpu", "replay"} - {kind}:   # the options of the kind not used are checked all the same
        check_options(_plugin("evaluator", other, "evaluator.kind"), getattr(run.config.evaluator, other),
                      f"evaluator.{other}", ("problem", "cases", "baseline", "seed", "out_dir"))
    w, fixed = run.config.workers, {}
    if kind == "gpu" and w.backend != "inline":   # one worker per GPU of the host or of the Ray cluster
        from .evaluate.gpu_pool import PooledGpuEvaluator
        cls, fixed = PooledGpuEvaluator, {"workers": w}
    try:
        evaluator = construct(cls, options, f"evaluator.{kind}", problem=run.problem, cases=run.cases,
                              baseline=run.baseline, seed=run.config.seed, out_dir=run.config.out_dir, **fixed)
        if kind == "replay":
            _fits_recording(run.config.search.population, evaluator.rec)
        if kind == "replay" and w.count:   # simulated workers holding each candidate for its recorded time
            from .evaluate.replay_pool import simulate
            evaluator = simulate(evaluator, w.backend, w.count, w.queue_depth, w.time_scale, w.address)
        return racing(run, evaluator) if race else evaluator
    except ValueError as exc:   # ReplayError and friends: the config asks for something the data cannot give
        raise ConfigError(f"config key 'evaluator': {exc}") from exc
    except RuntimeError as exc:   # ray_backend.RayUnavailable: not installed, or no cluster at the address
        if type(exc).__name__ != "RayUnavailable":
            raise
        raise ConfigError(f"config key 'workers.backend': {exc}") from exc


def _fits_recording(population: int, rec: Any) -> None:
    """A replay answers only the genomes its recording holds: a population larger than that could never be filled
    with distinct candidates (the search would time every recorded genome and then stall), so it is refused."""
    if population > len(rec.entries):
        raise ConfigError(f"config key 'search.population' is {population}, more than the {len(rec.entries)} genomes "
                          f"the replayed recording {rec.path.name} holds; a replay's population may be at most that")


def racing(run: Run, evaluator: Evaluator) -> Evaluator:
    """The evaluator behind racing when search.racing.enabled (evaluate/racing.py); else as it is."""
    if not run.config.search.racing.enabled:
        return evaluator
    from .evaluate.racing import RacingEvaluator
    from .protocols import Races
    if not isinstance(evaluator, Races):
        evaluator.close()
        raise ConfigError(f"config key 'search.racing.enabled': the {evaluator.info.kind} evaluator cannot time in "
                          f"two legs; set it to false")
    return RacingEvaluator(evaluator, run.config.search.racing, run.problem, run.cases)


def make_observers(run: Run, names: Sequence[str] | None = None) -> list[Observer]:
    out = []
    for i, name in enumerate(names if names is not None else run.config.observers):
        cls = _plugin("observer", name, f"observers[{i}]")
        out.append(cls(problem=run.problem, config=run.config))
    return out
