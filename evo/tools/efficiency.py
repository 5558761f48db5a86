"""The search-efficiency benchmark: evaluations until a genome within 1% of the optimum, for random search, our
loop and Kernel Tuner's GA, on one recorded space named on the command line
(`python -m kernel_factory.evo.tools.efficiency --problem P --dtype D --recording FILE --out REPORT.md`).

It writes the raw result (REPORT.json: what each method did on each seed) and the report rendered from it
(efficiency_report.py); `--from REPORT.json` renders the report again without running anything. The loop's search
defaults (evo/config.py) were tuned on the RMSNorm forward bf16 recording (TUNED_RECORDING), so a report on that
recording flatters the loop: each report says whether its recording is that one (in-sample) or not (held out)."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import build, config
from ..loop import evolve
from ..evaluate import recording, worker_process
from ..evaluate.replay import ReplayError, ReplayEvaluator
from ..history import History, Record
from ..protocols import GenerationStats, RunInfo, RunSummary
from ..types import Candidate, EvalResult, Status
from ..variation import Proposer
from . import efficiency_report
from .efficiency_kt import KT_GA_DEFAULTS, kt_space_size, kt_trial, write_kt_cache
from .landscape import Landscape

# The recording the search defaults were tuned on (population, tournament, weights: the sweeps in commit 6e20ce6's
# runs/evidence/): a report on a file with its sha256 is in-sample.
TUNED_ON = ("rmsnorm_fwd", "bfloat16")
TUNED_RECORDING = Path(__file__).resolve().parents[2] / "problems" / "recorded" / "rmsnorm_fwd-bfloat16-h200.jsonl.gz"
TARGET = 0.99                 # a hit: fitness >= 99% of the space's optimum
PRIOR_EVALUATIONS = 96        # loop-full starts from one earlier run of this size ("the second run of a problem")
PRIOR_SEED_OFFSET = 1000      # the earlier run's seed, so that it is not the same run
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# Loop variants: search settings, and whether the run starts from an earlier run's results.
COLD: dict[str, Any] = {"policy": "static", "lessons": False, "surrogate": {"enabled": False},
                        "warm_start": {"enabled": False}}
DEFAULTS = config.SearchConfig()
# The defaults before issue 32 made the surrogate an ensemble that screens every generation at population 8: the
# row that shows what the change bought on each recording.
BEFORE: dict[str, Any] = {"population": 12, "surrogate": {"enabled": False}}
LOOP_VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "loop-defaults": ({}, False),
    "loop-before": (BEFORE, False),
    "loop-cold": (COLD, False),
    "loop-bandit": ({**COLD, "policy": "bandit"}, False),
    "loop-surrogate": ({**COLD, "surrogate": {"enabled": True}}, False),
    "loop-full": ({"policy": "bandit", "lessons": True, "surrogate": {"enabled": True},
                   "warm_start": {"enabled": True}}, True),
}
METHODS = ("random", *LOOP_VARIANTS, "kt-ga")


@dataclass(frozen=True)
class Trial:
    """One method on one seed: the distinct genomes it evaluated, in order."""

    order: tuple[str, ...]
    prior: tuple[str, ...] = ()       # what the earlier run evaluated (loop-full only); not counted in `order`
    ran: tuple[tuple[str, Any], ...] = ()   # how the method ran, where it reports that (Kernel Tuner's GA)


# (problem, dtype, recording path, search settings every loop run takes, as sorted (key, value) pairs):
# picklable and hashable, for the worker processes and their caches.
Source = tuple


@lru_cache(maxsize=2)
def replay(source: Source) -> tuple[build.Run, ReplayEvaluator]:
    """One replay evaluator per process: it keeps no state between candidates, and reading the recording is slow."""
    run = build.prepare(run_config(source, 0, COLD, 1))
    return run, build.make_evaluator(run, "replay")


@lru_cache(maxsize=2)
def landscape(source: Source) -> Landscape:
    run, evaluator = replay(source)
    rec = evaluator.rec
    sampling = str(rec.header.get("sampling", "exhaustive"))
    if not sampling.startswith("exhaustive"):
        raise ReplayError(f"the benchmark searches a whole space, and this recording is not one ({sampling}): few "
                          f"neighbours of a sampled genome were measured, so every method would search blind. Record "
                          f"a sub-space whole instead (kernel-factory record CONFIG -o 'search.space.GENE=[...]')")
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
    problem, dtype, path, base = source
    return config.parse({"problem": problem, "dtypes": [dtype], "seed": seed, "observers": [],
                         "shapes": recorded_shapes(path, dtype),
                         "evaluator": {"kind": "replay", "replay": {"recording": path}},
                         "search": {**dict(base), **search, "generations": budget, "max_evaluations": budget}})


@lru_cache(maxsize=4)
def recorded_shapes(path: str, dtype: str) -> str:
    """The shapes the recording measured in dtype (its cases), as a config's `shapes`: a recording of a few
    workload rows replays those, not the problem's benchmark set."""
    try:
        cases = recording.header(path).get("cases", [])
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the recording {path}: {exc}") from None
    shapes = [key.split(":", 1)[1] for key in cases if key.split(":", 1)[0] == dtype]
    if not shapes:
        raise ReplayError(f"the recording {path} measured no {dtype} case (its cases: {', '.join(cases) or 'none'})")
    return ",".join(shapes)


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


def loop_trial(method: str, seed: int, budget: int, source: Source) -> Trial:
    search, wants_prior = LOOP_VARIANTS[method]
    prior = run_loop(source, seed + PRIOR_SEED_OFFSET, COLD, PRIOR_EVALUATIONS) if wants_prior else []
    pairs = run_loop(source, seed, search, budget, prior)
    return Trial(tuple(c.id for c, _ in pairs), tuple(c.id for c, _ in prior))


def trial(method: str, seed: int, budget: int, cache_path: Path, source: Source) -> Trial:
    if method == "random":
        return random_trial(landscape(source), seed)
    if method == "kt-ga":
        order, ran = kt_trial(landscape(source), cache_path, seed, budget)
        return Trial(order, ran=tuple(ran.items()))
    return loop_trial(method, seed, budget, source)


def one_blas_thread() -> contextlib.AbstractContextManager:
    """Worker processes started inside this block run their BLAS on one thread. The surrogate solves a few hundred
    features every generation, and OpenBLAS spins a thread per core in every worker: `jobs` workers on as many cores
    then wait on each other's threads (one solve took 60-200 ms instead of 7 ms on 2 cores). Workers are spawned, not
    forked, so that their numpy starts after the variables are set; this process's own BLAS is left as it was."""
    return worker_process._environment({name: "1" for name in BLAS_THREADS})


def measure(methods: Sequence[str], seeds: Sequence[int], budget: int, cache_path: Path,
            jobs: int, source: Source) -> dict[str, list[Trial] | str]:
    """Every method on every seed (in parallel processes; each trial is reproducible from its seed alone).
    A method the loop cannot run yet maps to the reason instead of its trials."""
    why = loop_unavailable()
    skipped = {m: why for m in methods if why and m in LOOP_VARIANTS}
    tasks = [(m, s) for m in methods if m not in skipped for s in seeds]
    with one_blas_thread(), ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        done = pool.map(trial, [m for m, _ in tasks], [s for _, s in tasks], [budget] * len(tasks),
                        [cache_path] * len(tasks), [source] * len(tasks))
        out: dict[str, list[Trial] | str] = dict(skipped)
        for (method, _), result in zip(tasks, done):
            out.setdefault(method, []).append(result)
    return {m: out[m] for m in methods}




def seed_result(seed: int, t: Trial, land: Landscape, budget: int) -> dict[str, Any]:
    """What one trial did, as the raw JSON keeps it: distinct evaluations to the first hit (None: no hit in the
    ones it made), distinct evaluations made (at most the budget), and for loop-full the earlier run's too."""
    spent = t.order[:budget]
    out: dict[str, Any] = {"seed": seed, "hit": evaluations_to_target(spent, land.fitness, land.target),
                           "spent": len(spent)}
    if t.prior:
        out |= {"prior_hit": evaluations_to_target(t.prior, land.fitness, land.target), "prior_spent": len(t.prior)}
    return out | dict(t.ran)


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def summarize(results: Mapping[str, list[Trial] | str], land: Landscape, source: Source, budget: int,
              seeds: Sequence[int], jobs: int, wall_s: float, command: str) -> dict[str, Any]:
    """The raw result: everything the report says, and nothing it does not (efficiency_report renders it)."""
    problem, dtype, recording, base = source
    ran = {m: t for m, t in results.items() if not isinstance(t, str)}
    kt = None
    if "kt-ga" in ran:
        size, cached = kt_space_size(land)
        kt = {"version": importlib.metadata.version("kernel-tuner"), "options": KT_GA_DEFAULTS, "space": size,
              "cached": cached}
    cold = [t.order for t in ran.get("loop-cold", [])]
    weights = "/".join(f"{op.weight:g}" for op in DEFAULTS.operators.values())
    return {"format": efficiency_report.FORMAT, "problem": problem, "dtype": dtype, "recording": recording,
            "sha256": sha256(recording), "in_sample": TUNED_RECORDING.is_file() and
            sha256(recording) == sha256(TUNED_RECORDING), "tuned_on": " ".join(TUNED_ON), "label": land.label,
            "device": land.device, "genomes": len(land.fitness),
            "hits": sum(f >= land.target for f in land.fitness.values()), "target_fraction": TARGET,
            "optimum": land.optimum, "target": land.target,
            "search": {"population": DEFAULTS.population, "tournament": DEFAULTS.tournament_size,
                       "elitism": DEFAULTS.elitism, "weights": weights, "surrogate": surrogate_settings()},
            "overrides": dict(base), "prior": {"evaluations": PRIOR_EVALUATIONS, "seed_offset": PRIOR_SEED_OFFSET},
            "budget": budget, "seeds": len(seeds), "jobs": jobs, "wall_s": round(wall_s, 1), "command": command,
            "kt": kt, "methods": {m: t if isinstance(t, str) else
                                  [seed_result(s, x, land, budget) for s, x in zip(seeds, t)]
                                  for m, t in results.items()},
            "same_as_cold": [m for m in ran if m in LOOP_VARIANTS and m != "loop-cold"
                             and [t.order for t in ran[m]] == cold]}


def surrogate_settings() -> str:
    """The default surrogate as the report names it."""
    s = DEFAULTS.surrogate
    state = "on" if s.enabled else "off"
    return (f"{state}: {s.members} bootstrap ridge members, upper confidence kappa {s.kappa:g}, oversample "
            f"{s.oversample:g}, explore {s.explore:g}, min_history {s.min_history}")


def default_out(source: Source, now: datetime.datetime) -> Path:
    """A new folder per report, so that a run never overwrites committed evidence."""
    return Path("runs") / "efficiency" / f"{source[0]}-{source[1]}-{now.strftime('%Y%m%d-%H%M%S')}" / \
        "search-efficiency.md"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.efficiency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", help="the problem whose recording to search, e.g. rmsnorm_fwd or softmax_fwd")
    parser.add_argument("--dtype", help="the recording's dtype, e.g. bfloat16")
    parser.add_argument("--recording", help="the recording file, e.g. problems/recorded/"
                                            "rmsnorm_fwd-bfloat16-h200.jsonl.gz")
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 for every method")
    parser.add_argument("--budget", type=int, default=1500, help="distinct evaluations per run at most")
    parser.add_argument("--population", type=int, help="the loop's population, instead of evo/config.py's default")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes")
    parser.add_argument("--out", help="the report to write (REPORT.md; its raw result goes beside it as REPORT.json); "
                                      "neither may exist yet (default: a new folder runs/efficiency/<problem>-"
                                      "<dtype>-<UTC time>/)")
    parser.add_argument("--from", dest="source", help="render the report of a raw result REPORT.json again (to "
                                                      "stdout, and to --out if given); nothing runs")
    args = parser.parse_args(argv)
    if args.source:
        return args
    if missing := [f"--{k}" for k in ("problem", "dtype", "recording") if not getattr(args, k)]:
        parser.error(f"{', '.join(missing)} required: a report names its problem, dtype and recording (the tuned-on "
                     f"one is {' '.join(TUNED_ON)}, {TUNED_RECORDING.name}; another is held out)")
    if not Path(args.recording).is_file():
        parser.error(f"--recording {args.recording}: no such file")
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := [m for m in args.methods if m not in METHODS]:
        parser.error(f"unknown method {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if "kt-ga" in args.methods and importlib.util.find_spec("kernel_tuner") is None:
        parser.error("kt-ga needs Kernel Tuner: pip install -e '.[bench]', or leave kt-ga out of --methods")
    if min(args.seeds, args.budget, args.jobs, args.population or 1) < 1:
        parser.error("--seeds, --budget, --jobs and --population must be >= 1")
    return args


def rerender(source: str, out: str | None) -> int:
    try:
        text = efficiency_report.markdown(json.loads(Path(source).read_text()))
    except (OSError, ValueError, KeyError) as exc:
        print(f"--from {source}: not a search-efficiency result ({exc!r})", file=sys.stderr)
        return 2
    print(text, end="")
    if out:
        Path(out).write_text(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.source:
        return rerender(args.source, args.out)
    base = (("population", args.population),) if args.population else ()
    source: Source = (args.problem, args.dtype, args.recording, base)
    out = Path(args.out) if args.out else default_out(source, datetime.datetime.now(datetime.timezone.utc))
    if taken := [p for p in (out, out.with_suffix(".json")) if p.exists()]:
        print(f"--out {out}: {taken[0]} exists; the benchmark never overwrites a report (choose a new path)",
              file=sys.stderr)
        return 2
    try:
        started, land = time.monotonic(), landscape(source)
    except (config.ConfigError, ReplayError) as exc:
        print(f"cannot replay {args.problem} {args.dtype} from {args.recording}: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cache_path = write_kt_cache(land, Path(tmp) / "kt-cache.json")
        results = measure(args.methods, range(args.seeds), args.budget, cache_path, args.jobs, source)
    command = "python -m kernel_factory.evo.tools.efficiency " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if a)
    data = summarize(results, land, source, args.budget, range(args.seeds), args.jobs, time.monotonic() - started,
                     command)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    out.write_text(efficiency_report.markdown(data))
    print(out.read_text(), end="")
    print(f"written -> {out}, {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
