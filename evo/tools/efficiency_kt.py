"""Kernel Tuner's side of the search-efficiency benchmark: our recording exported to its cache-file format, our
feasibility rule as its restriction, and its genetic_algorithm run in simulation mode on that data."""
from __future__ import annotations

import contextlib
import json
import random
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..types import GeneSpace, GeneValue
from .landscape import Landscape

KT_GA_DEFAULTS = "popsize 26, maxiter 90, single_point crossover, mutation_chance 55, constraint_aware True"


def kt_tune_params(space: GeneSpace) -> dict[str, list[GeneValue]]:
    return {g.name: list(g.choices) for g in space.genes}


def kt_key(values: Sequence[GeneValue]) -> str:
    """Kernel Tuner's cache key: str() of each parameter value, in tune_params order, joined by commas."""
    return ",".join(str(v) for v in values)


def kt_restriction(space: GeneSpace) -> Callable[[Mapping[str, GeneValue]], bool]:
    """Our feasibility rule as a Kernel Tuner restriction: a function of the parameter dict. A def, not a lambda:
    KT rewrites lambdas from their source text into expressions, which this one is not."""
    def feasible(params: Mapping[str, GeneValue]) -> bool:
        return space.why_infeasible(dict(params)) is None
    return feasible


def kt_cache(land: Landscape) -> dict[str, Any]:
    """The recording as a Kernel Tuner cache file. KT minimises `time`; time = 1 / fitness (the geomean over
    the benchmark shapes of candidate / baseline time), so its best entry is our optimum and "within 1%" keeps
    its meaning; a refused genome's time is KT's RuntimeFailedConfig. Infeasible genomes are absent: the restriction
    keeps KT from ever asking for them."""
    params = kt_tune_params(land.space)
    entries = {}
    for gid, genome in land.genomes.items():
        genes = genome.gene_dict
        values = [genes[name] for name in params]
        fitness = land.fitness[gid]
        # a genome the gate refused (fitness 0) is a failed run for KT, as its own cache files record one
        entries[kt_key(values)] = {**dict(zip(params, values)), "fitness": fitness,
                                   "time": 1.0 / fitness if fitness > 0 else "RuntimeFailedConfig"}
    # problem_size is not used in simulation mode; our fitness spans 11 shapes, which one size cannot name
    return {"device_name": land.device, "kernel_name": land.kernel_name, "problem_size": [1],
            "tune_params_keys": list(params), "tune_params": params, "objective": "time", "cache": entries}


def write_kt_cache(land: Landscape, path: Path) -> Path:
    path.write_text(json.dumps(kt_cache(land)))
    return path


def kt_space_size(land: Landscape) -> tuple[int, int]:
    """(configurations in Kernel Tuner's search space under our restriction, how many of them the cache holds)."""
    from kernel_tuner.searchspace import Searchspace
    params = kt_tune_params(land.space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        configs = Searchspace(params, [kt_restriction(land.space)], max_threads=10**9).list
    cached = set(kt_cache(land)["cache"])
    return len(configs), sum(kt_key(c) in cached for c in configs)


@contextlib.contextmanager
def seeded_globals(seed: int) -> Iterator[None]:
    """Kernel Tuner's strategies draw from the global `random` and `numpy.random`; seed both for the call and
    restore them afterwards."""
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextlib.contextmanager
def watched_ga(sizes: list[int], stopped: list[str]) -> Iterator[None]:
    """Record what Kernel Tuner's GA does as it runs: the size of each generation it evaluates, and the stop
    criterion (max_fevals) if one ends it. KT 1.5.0's GA builds one CostFunc per call and evaluates a whole
    generation with one eval_all; a subclass in its place sees both, and leaves every result as it was."""
    from kernel_tuner.strategies import genetic_algorithm as ga
    from kernel_tuner.util import StopCriterionReached

    class Watched(ga.CostFunc):
        def eval_all(self, xs, check_restrictions=True):   # noqa: ANN001, ANN202 (KT's signature)
            sizes.append(len(xs))
            try:
                return super().eval_all(xs, check_restrictions=check_restrictions)
            except StopCriterionReached as exc:
                stopped.append(str(exc) or "stop criterion")
                raise
    original, ga.CostFunc = ga.CostFunc, Watched
    try:
        yield
    finally:
        ga.CostFunc = original


def runs(sizes: Sequence[int]) -> list[list[int]]:
    """Generation sizes as [size, how many generations in a row]: [[2, 20], [0, 70]]."""
    out: list[list[int]] = []
    for size in sizes:
        if out and out[-1][0] == size:
            out[-1][1] += 1
        else:
            out.append([size, 1])
    return out


def stop_rule(sizes: Sequence[int], stopped: Sequence[str]) -> str:
    """Why the GA ended: its budget (max_fevals), an empty population (KT breeds a generation only while the
    configurations it has evaluated, repeats included, number fewer than the space holds; then it runs out its
    generations evaluating nothing), or its last generation (maxiter)."""
    if stopped:
        return "max_fevals"
    return "empty" if sizes and sizes[-1] == 0 else "maxiter"


def kt_trial(land: Landscape, cache_path: Path, seed: int, budget: int) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Kernel Tuner's genetic_algorithm in simulation mode on the exported cache, with its default options: the
    distinct configurations it evaluated, in order, and how it ran (its generations' sizes and its stop rule).

    KT's simulation runner charges one evaluation the first time it serves a configuration and none for a repeat
    (SimulationRunner.visited_results); the results it returns list repeats too, so the distinct configurations
    in the order returned are exactly the evaluations it charged."""
    import kernel_tuner
    params = kt_tune_params(land.space)
    ids = {kt_key([g.gene_dict[n] for n in params]): gid for gid, g in land.genomes.items()}
    sizes: list[int] = []
    stopped: list[str] = []
    with seeded_globals(seed), warnings.catch_warnings(), watched_ga(sizes, stopped):
        warnings.simplefilter("ignore")   # "no parameter names a thread block dimension": nothing is launched
        results, _ = kernel_tuner.tune_kernel(
            land.kernel_name, "", [1], [], params, restrictions=[kt_restriction(land.space)],
            cache=str(cache_path), simulation_mode=True, strategy="genetic_algorithm",
            strategy_options={"max_fevals": budget}, quiet=True)
    order = [ids[kt_key([r[n] for n in params])] for r in results if "__error__" not in r]
    return tuple(dict.fromkeys(order)), {"generations": runs(sizes), "evaluated": sum(sizes),
                                         "stop": stop_rule(sizes, stopped)}
