"""The search-efficiency benchmark: evaluations until a genome within 1% of the optimum, for random search, our
loop and Kernel Tuner's GA, on a recorded space (`python -m kernel_factory.evo.tools.efficiency --help`).

The loop's search defaults (evo/config.py) were tuned on the RMSNorm forward bf16 recording (TUNED_ON), so a table
on that recording flatters the loop; the default report is on another problem's recording, and every report
says which recording it is and whether the settings were tuned on it."""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import inspect
import math
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import build, config
from ..loop import evolve
from ..evaluate.replay import ReplayError, ReplayEvaluator
from ..history import History, Record
from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult, Status
from ..variation import Proposer
from .efficiency_kt import KT_GA_DEFAULTS, kt_space_size, kt_trial, write_kt_cache
from .landscape import Landscape

# The recording the search defaults were tuned on (population, tournament, weights: runs/evidence/
# search-efficiency-population24.md and the sweeps before it): (problem, dtype).
TUNED_ON = ("rmsnorm_fwd", "bfloat16")
# The default report: another problem's recording, measured on the same H200, never used for tuning.
REPORT_ON = ("softmax_fwd", "bfloat16")
TARGET = 0.99                 # a hit: fitness >= 99% of the space's optimum
PRIOR_EVALUATIONS = 96        # loop-full starts from one earlier run of this size ("the second run of a problem")
PRIOR_SEED_OFFSET = 1000      # the earlier run's seed, so that it is not the same run

# Loop variants: search settings, and whether the run starts from an earlier run's results.
COLD: dict[str, Any] = {"policy": "static", "lessons": False, "surrogate": {"enabled": False},
                        "warm_start": {"enabled": False}}
DEFAULTS = config.SearchConfig()
LOOP_VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "loop-defaults": ({}, False),
    "loop-cold": (COLD, False),
    "loop-bandit": ({**COLD, "policy": "bandit"}, False),
    "loop-surrogate": ({**COLD, "surrogate": {"enabled": True}}, False),
    "loop-full": ({"policy": "bandit", "lessons": True, "surrogate": {"enabled": True},
                   "warm_start": {"enabled": True}}, True),
}
METHODS = ("random", *LOOP_VARIANTS, "kt-ga")
FULL_BOTH = "loop-full + earlier run"   # a table row: loop-full counted together with the run it starts from


@dataclass(frozen=True)
class Trial:
    """One method on one seed: the distinct genomes it evaluated, in order."""

    order: tuple[str, ...]
    prior: tuple[str, ...] = ()       # what the earlier run evaluated (loop-full only); not counted in `order`


Source = tuple   # (problem, dtype, recording path or None for the problem's bundled one): picklable, hashable


@lru_cache(maxsize=2)
def replay(source: Source = (*TUNED_ON, None)) -> tuple[build.Run, ReplayEvaluator]:
    """One replay evaluator per process: it keeps no state between candidates, and reading the recording is slow."""
    run = build.prepare(run_config(source, 0, COLD, 1))
    return run, build.make_evaluator(run, "replay")


@lru_cache(maxsize=2)
def landscape(source: Source = (*TUNED_ON, None)) -> Landscape:
    run, evaluator = replay(source)
    rec = evaluator.rec
    genomes = {gid: genome for gid, (genome, _) in rec.entries.items()}
    fitness = {r.candidate_id: r.fitness for r in evaluator.evaluate([Candidate(g) for g in genomes.values()])}
    optimum = max(fitness.values())
    gpu = rec.header.get("fingerprint", {}).get("gpu", "GPU")
    return Landscape(evaluator.space, genomes, fitness, rec.label, gpu, run.problem.kernel_name, optimum,
                     TARGET * optimum)


def evaluations_to_target(order: Sequence[str], fitness: Mapping[str, float], target: float) -> int | None:
    """The 1-based count of distinct genomes evaluated up to and including the first that reaches `target`
    (a repeat of a genome already evaluated costs nothing); None if none does."""
    for count, gid in enumerate(dict.fromkeys(order), start=1):
        if fitness.get(gid, 0.0) >= target:
            return count
    return None


def random_trial(land: Landscape, seed: int) -> Trial:
    """Uniform random order over the feasible genomes, without replacement."""
    order = sorted(land.genomes)
    random.Random(seed).shuffle(order)
    return Trial(tuple(order))


class OrderObserver:
    """Remembers what the loop evaluated, in order: the benchmark's only window into a run."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Candidate, EvalResult]] = []

    def on_start(self, run: RunInfo) -> None:
        pass

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        # a child the rule refused was never evaluated: it costs the search nothing and is not counted
        self.pairs.extend((c, r) for c, r in results if r.status is not Status.INFEASIBLE)

    def on_generation(self, stats: GenerationStats) -> None:
        pass

    def on_end(self, summary: RunSummary) -> None:
        pass


def run_config(source: Source, seed: int, search: Mapping[str, Any], budget: int) -> config.RunConfig:
    # generations = budget never binds first: every generation evaluates at least one new genome
    problem, dtype, path = source
    return config.parse({"problem": problem, "dtypes": [dtype], "seed": seed, "observers": [],
                         "evaluator": {"kind": "replay", "replay": {"recording": path} if path else {}},
                         "search": {**search, "generations": budget, "max_evaluations": budget}})


# How the harness calls the loop, the way evo/run.py's execute() composes it; checked before anything runs.
EVOLVE_PARAMS = ("space", "proposer", "evaluator", "observers", "search", "rng", "run_id", "history", "seeds")


def loop_unavailable() -> str | None:
    """Why the harness cannot drive the loop in this build, or None when it can."""
    params = tuple(inspect.signature(evolve).parameters)
    if params[:len(EVOLVE_PARAMS)] != EVOLVE_PARAMS:
        return (f"not available yet: evolve{inspect.signature(evolve)} is not the call this harness makes "
                f"({', '.join(EVOLVE_PARAMS)})")
    return None


def run_loop(source: Source, seed: int, search: Mapping[str, Any], budget: int,
             prior: Sequence[tuple[Candidate, EvalResult]] = ()) -> list[tuple[Candidate, EvalResult]]:
    """One loop run on the replay evaluator; earlier runs' results go into its history and, with warm start on,
    its best genomes seed the first population, as evo/run.py does with what MLflow holds."""
    cfg = run_config(source, seed, search, budget)
    run = build.prepare(cfg)
    history = History([Record.of(c, r, f"prior-{seed}") for c, r in prior])
    seeds = [r.genome for r in history.best(cfg.search.warm_start.count)] if cfg.search.warm_start.enabled else []
    observer = OrderObserver()
    space = replay(source)[1].space
    evolve(space, Proposer(space, run.operators, cfg.search), replay(source)[1], [observer],
           cfg.search, random.Random(seed), f"efficiency-{seed}", history, seeds)
    return observer.pairs


def loop_trial(method: str, seed: int, budget: int, source: Source = (*TUNED_ON, None)) -> Trial:
    search, wants_prior = LOOP_VARIANTS[method]
    prior = run_loop(source, seed + PRIOR_SEED_OFFSET, COLD, PRIOR_EVALUATIONS) if wants_prior else []
    pairs = run_loop(source, seed, search, budget, prior)
    return Trial(tuple(c.id for c, _ in pairs), tuple(c.id for c, _ in prior))


def trial(method: str, seed: int, budget: int, cache_path: Path, source: Source) -> Trial:
    if method == "random":
        return random_trial(landscape(source), seed)
    if method == "kt-ga":
        return Trial(kt_trial(landscape(source), cache_path, seed, budget))
    return loop_trial(method, seed, budget, source)


def measure(methods: Sequence[str], seeds: Sequence[int], budget: int, cache_path: Path,
            jobs: int, source: Source = (*TUNED_ON, None)) -> dict[str, list[Trial] | str]:
    """Every method on every seed (in parallel processes; each trial is reproducible from its seed alone).
    A method the loop cannot run yet maps to the reason instead of its trials."""
    why = loop_unavailable()
    skipped = {m: why for m in methods if why and m in LOOP_VARIANTS}
    tasks = [(m, s) for m in methods if m not in skipped for s in seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = pool.map(trial, [m for m, _ in tasks], [s for _, s in tasks], [budget] * len(tasks),
                        [cache_path] * len(tasks), [source] * len(tasks))
        out: dict[str, list[Trial] | str] = dict(skipped)
        for (method, _), result in zip(tasks, done):
            out.setdefault(method, []).append(result)
    return {m: out[m] for m in methods}


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics; a miss (inf) censors every quantile that touches it."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return math.inf if math.isinf(xs[hi]) else xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def columns(results: Mapping[str, list[Trial] | str], land: Landscape,
            budget: int) -> dict[str, tuple[list[float], list[int]]]:
    """Per method, per seed: evaluations to target (inf: none within the budget) and evaluations spent. loop-full
    is also counted with its earlier run, whose best genomes it starts from."""
    out = {}
    for method, trials in results.items():
        if isinstance(trials, str):
            continue
        counts = [evaluations_to_target(t.order, land.fitness, land.target) for t in trials]
        out[method] = ([math.inf if n is None or n > budget else float(n) for n in counts],
                       [min(len(t.order), budget) for t in trials])
        if method == "loop-full":
            out[FULL_BOTH] = ([both_runs(t, land) for t in trials],
                              [len(t.prior) + n for t, n in zip(trials, out[method][1])])
    return out


def both_runs(t: Trial, land: Landscape) -> float:
    """Evaluations to target over the earlier run and then this one; inf when neither found a hit."""
    first = evaluations_to_target(t.prior, land.fitness, land.target)
    then = evaluations_to_target(t.order, land.fitness, land.target)
    if first is not None:
        return float(first)
    return math.inf if then is None else float(len(t.prior) + then)


def fmt(x: float, budget: int) -> str:
    return f"> {budget}" if math.isinf(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def ratio(a: float, b: float | None) -> str:
    if b is None or math.isinf(a) or math.isinf(b):
        return "n/a"
    return f"{a / b:.{2 if a / b >= 0.1 else 3}f}x"


def table(results: Mapping[str, list[Trial] | str], land: Landscape, budget: int) -> list[str]:
    cols = columns(results, land, budget)
    med = {m: quantile(h, 0.5) for m, (h, _) in cols.items()}
    lines = ["| method | median evaluations to target | IQR | min to max | reached | median evaluations spent "
             "| vs random | vs kt-ga |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {m} | {why} | | | | | | |" for m, why in results.items() if isinstance(why, str)]
    for method, (h, spent) in cols.items():
        lines.append(f"| {method} | {fmt(med[method], budget)} | {fmt(quantile(h, 0.25), budget)} to "
                     f"{fmt(quantile(h, 0.75), budget)} | {fmt(min(h), budget)} to {fmt(max(h), budget)} | "
                     f"{sum(map(math.isfinite, h))}/{len(h)} | "
                     f"{quantile(spent, 0.5):.0f} | {ratio(med[method], med.get('random'))} | "
                     f"{ratio(med[method], med.get('kt-ga'))} |")
    lines += ["", "Per seed, evaluations to target (-: none within the budget):", "",
              "| seed | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)]
    for seed, row in enumerate(zip(*(h for h, _ in cols.values()))):
        lines.append(f"| {seed} | " + " | ".join("-" if math.isinf(x) else f"{x:.0f}" for x in row) + " |")
    return lines


def notes(results: Mapping[str, list[Trial] | str], land: Landscape, budget: int) -> list[str]:
    n, k = len(land.fitness), sum(f >= land.target for f in land.fitness.values())
    ran = {m: t for m, t in results.items() if not isinstance(t, str)}
    out = [f"- **random**: a seeded shuffle of the {n} feasible genomes, read in order; the expected evaluations "
           f"to the first of {k} hits are (n+1)/(k+1) = {(n + 1) / (k + 1):.0f}."] if "random" in ran else []
    if set(ran) & set(LOOP_VARIANTS):
        out.append("- **loop-\\***: `evo.loop.evolve` composed as `evo/run.py` does (Proposer, History, warm-start "
                   f"seeds), on the replay evaluator, with the search defaults of `evo/config.py` (population "
                   f"{DEFAULTS.population}, tournament {DEFAULTS.tournament_size}, elitism {DEFAULTS.elitism}, "
                   "operator weights 0.5/0.3/0.2) except generations = max_evaluations = budget. loop-defaults: "
                   "those defaults as they are (no earlier run, so no warm start); loop-cold: policy static, lessons, "
                   "surrogate and warm start off; loop-bandit: policy bandit only; loop-surrogate: surrogate only; "
                   "loop-full: all four on, starting from the "
                   f"{PRIOR_EVALUATIONS} results of one loop-cold run with seed + {PRIOR_SEED_OFFSET}, whose "
                   "evaluations are not counted. Counted: every candidate the loop sent to the evaluator (failures "
                   "included), in order.")
    if "kt-ga" in ran:
        size, cached = kt_space_size(land)
        out.append(f"- **kt-ga**: Kernel Tuner {importlib.metadata.version('kernel-tuner')}, `tune_kernel(..., "
                   f"strategy='genetic_algorithm', strategy_options={{'max_fevals': {budget}}}, simulation_mode="
                   f"True, cache=<export>)` with the GA's default options ({KT_GA_DEFAULTS}). Objective `time` = "
                   f"1/fitness, minimised. Our feasibility rule is a KT restriction: KT's search space holds {size} "
                   f"configurations, {cached} of them in the cache of {n} entries. Seeds: `random.seed(s)` and "
                   "`numpy.random.seed(s)` before each call (KT draws from both). Counted: distinct configurations "
                   "in the order KT returned results, which is what its simulation runner charges to max_fevals "
                   "(a repeat served from the cache costs nothing). After maxiter = 90 generations the GA stops, "
                   "usually well before the budget: see 'median evaluations spent'.")
    if "loop-full" in ran:
        found = sum(evaluations_to_target(t.prior, land.fitness, land.target) is not None for t in ran["loop-full"])
        out.append(f"- **{FULL_BOTH}**: the earlier run had itself evaluated a hit in {found}/{len(ran['loop-full'])} "
                   "seeds, and warm start puts it into loop-full's first population. This row counts the earlier "
                   f"run's evaluations up to its hit, or all {PRIOR_EVALUATIONS} plus loop-full's when it found none.")
    cold = [t.order for t in ran.get("loop-cold", [])]
    out += [f"- {m} evaluated exactly what loop-cold did on every seed: its settings had no effect in this build."
            for m in ran if m in LOOP_VARIANTS and m != "loop-cold" and [t.order for t in ran[m]] == cold]
    return out


def report(results: Mapping[str, list[Trial] | str], land: Landscape, budget: int, seeds: int, wall_s: float,
           jobs: int, source: Source = (*TUNED_ON, None), command: str = "") -> str:
    k = sum(f >= land.target for f in land.fitness.values())
    tuned_here = tuple(source[:2]) == TUNED_ON and source[2] is None
    lines = [f"# Search efficiency: {source[0]} ({source[1]}) on recorded {land.device} measurements", "",
             f"- Data: {land.label}. Replayed: no kernel ran.",
             f"- Search settings: the defaults of `evo/config.py`, tuned on the {TUNED_ON[0]} {TUNED_ON[1]} "
             "recording. " + ("**This is that recording: the loop's rows are in-sample, not a held-out measure.**"
                              if tuned_here else "This recording was not used to tune them (held out)."),
             f"- Target: fitness >= {TARGET} x the space's optimum {land.optimum:.4f}, i.e. >= {land.target:.4f} "
             f"({k} of {len(land.fitness)} genomes).",
             f"- Measure: distinct genomes evaluated until the first hit is evaluated; budget {budget} per run; "
             f"seeds 0-{seeds - 1}. A run with no hit within the budget counts as \"> {budget}\" (medians and "
             "IQRs that reach such runs are censored).", "",
             *table(results, land, budget), "", "How each method was run and counted:", "",
             *notes(results, land, budget), "",
             f"Made by `{command or 'python -m kernel_factory.evo.tools.efficiency'}` in {wall_s:.0f} s "
             f"with {jobs} processes."]
    return "\n".join(lines) + "\n"


def default_out(source: Source, now: datetime.datetime) -> Path:
    """A new folder per report, so that a run never overwrites committed evidence."""
    return Path("runs") / "efficiency" / f"{source[0]}-{source[1]}-{now.strftime('%Y%m%d-%H%M%S')}" / \
        "search-efficiency.md"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.efficiency", description=__doc__)
    parser.add_argument("--problem", default=REPORT_ON[0],
                        help=f"problem whose recording to search (default {REPORT_ON[0]}: held out; the settings "
                             f"were tuned on {TUNED_ON[0]})")
    parser.add_argument("--dtype", default=REPORT_ON[1], help="the recording's dtype")
    parser.add_argument("--recording", help="a recording file (default: the problem's bundled one)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 for every method")
    parser.add_argument("--budget", type=int, default=1500, help="evaluations per run")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes")
    parser.add_argument("--out", help="markdown file to write, which must not exist yet (default: a new folder "
                                      "runs/efficiency/<problem>-<dtype>-<UTC time>/)")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := [m for m in methods if m not in METHODS]:
        parser.error(f"unknown method {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if "kt-ga" in methods and importlib.util.find_spec("kernel_tuner") is None:
        parser.error("kt-ga needs Kernel Tuner: pip install -e '.[bench]', or leave kt-ga out of --methods")
    if min(args.seeds, args.budget, args.jobs) < 1:
        parser.error("--seeds, --budget and --jobs must be >= 1")
    source: Source = (args.problem, args.dtype, args.recording)
    out = Path(args.out) if args.out else default_out(source, datetime.datetime.now(datetime.timezone.utc))
    if out.exists():
        parser.error(f"--out {out} exists; the benchmark never overwrites a report (choose a new path)")
    try:
        started, land = time.monotonic(), landscape(source)
    except (config.ConfigError, ReplayError) as exc:
        parser.error(f"cannot replay {args.problem} {args.dtype}: {exc}")
    with tempfile.TemporaryDirectory() as tmp:
        cache_path = write_kt_cache(land, Path(tmp) / "kt-cache.json")
        results = measure(methods, range(args.seeds), args.budget, cache_path, args.jobs, source)
    command = "python -m kernel_factory.evo.tools.efficiency " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if a)
    text = report(results, land, args.budget, args.seeds, time.monotonic() - started, args.jobs, source, command)
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
