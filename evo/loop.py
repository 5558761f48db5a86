"""The evolutionary loop: a short composition of named tools (DEAP selection, hall of fame and logbook; our
operators, evaluator and observers).

    population <- evaluate(template defaults + random feasible genomes)
    repeat until a budget is spent (generations, evaluations, wall clock):
        parents  <- tournament(population)
        children <- new, feasible offspring of parents, each made by one weighted operator
        evaluate(children)                        # failures come back as statuses with fitness 0
        population <- elite + tournament(population + children)
        hall of fame, logbook, observers <- this generation
"""
from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from deap import base, tools

from kernel_factory.evo.config import SearchConfig
from kernel_factory.evo.protocols import Evaluator, GenerationStats, Observer, RunSummary
from kernel_factory.evo.types import Candidate, EvalResult, GeneSpace, Genome
from kernel_factory.evo.variation import WeightedOperator, breed, initial_population, seeded_global_random


class FitnessMax(base.Fitness):
    weights = (1.0,)   # fitness is a speedup over the baseline: higher is better


class Individual:
    """What DEAP's tools select among: a candidate, its result and a DEAP fitness."""

    def __init__(self, candidate: Candidate, result: EvalResult):
        self.candidate, self.result = candidate, result
        self.fitness = FitnessMax((result.fitness,))


@dataclass
class Budget:
    generations: int
    max_evaluations: int | None
    wall_clock_s: float | None
    started: float

    def spent(self, generation: int, evaluations: int) -> str | None:
        if generation >= self.generations:
            return "generations"
        if self.max_evaluations is not None and evaluations >= self.max_evaluations:
            return "max_evaluations"
        if self.wall_clock_s is not None and time.monotonic() - self.started >= self.wall_clock_s:
            return "wall_clock"
        return None


def evolve(space: GeneSpace, operators: Sequence[WeightedOperator], evaluator: Evaluator,
           observers: Sequence[Observer], search: SearchConfig, rng: random.Random, run_id: str,
           seeds: Sequence[Genome] = ()) -> RunSummary:
    budget = Budget(search.generations, search.max_evaluations, search.wall_clock_s, time.monotonic())
    hof = tools.HallOfFame(search.hall_of_fame, similar=lambda a, b: a.candidate.id == b.candidate.id)
    logbook = tools.Logbook()
    seen: dict[str, Individual] = {}

    def evaluate(batch: list[Candidate], generation: int) -> list[Individual]:
        if search.max_evaluations is not None:
            batch = batch[:max(0, search.max_evaluations - len(seen))]
        results = evaluator.evaluate(batch) if batch else []
        new = [Individual(c, r) for c, r in zip(batch, results)]
        seen.update((ind.candidate.id, ind) for ind in new)
        hof.update(new)
        for obs in observers:
            obs.on_results(generation, [(i.candidate, i.result) for i in new])
        counts = Counter(i.result.status.value for i in new)
        fits = [i.result.fitness for i in seen.values()]
        best = hof[0] if len(hof) else None
        stats = GenerationStats(generation, len(seen), best.fitness.values[0] if best else 0.0,
                                statistics.median(fits) if fits else 0.0, best.candidate.id if best else "",
                                dict(counts), time.monotonic() - budget.started)
        logbook.record(gen=generation, evals=len(seen), new=len(new), best=stats.best_fitness,
                       median=stats.median_fitness, **stats.counts)
        for obs in observers:
            obs.on_generation(stats)
        return new

    population = evaluate(initial_population(space, search.population, search.init_random, rng, seeds), 0)
    generation, stop = 0, budget.spent(0, len(seen))
    while stop is None:
        generation += 1
        with seeded_global_random(rng):
            parents = tools.selTournament(population, search.population, search.tournament_size)
        children = breed([p.candidate for p in parents], search.population, operators, space, rng, set(seen),
                         generation)
        if not children:
            stop = "space_exhausted"
            break
        pool = population + evaluate(children, generation)
        elite = tools.selBest(pool, search.elitism)
        rest = [ind for ind in pool if ind not in elite]
        with seeded_global_random(rng):
            population = elite + tools.selTournament(rest, search.population - len(elite), search.tournament_size)
        stop = budget.spent(generation, len(seen))
    best = (hof[0].candidate, hof[0].result) if len(hof) and hof[0].result.fitness > 0 else None
    return RunSummary(run_id, generation, len(seen), stop, time.monotonic() - budget.started,
                      sum(i.result.gpu_s for i in seen.values()), best,
                      tuple((i.candidate, i.result) for i in hof), tuple(logbook))
