"""The evolutionary loop: a short composition of named tools (DEAP selection, hall of fame and logbook; our
proposer, evaluator and observers).

    population <- evaluate(warm-start seeds + template defaults + random feasible genomes)
    repeat until a budget is spent (generations, evaluations, wall clock):
        parents  <- tournament(population)
        children <- proposer(parents): new, feasible offspring; operators picked by credit, lessons applied,
                    surrogate screening                         (failures come back as statuses with fitness 0)
        observers <- the children the problem's rule refused    (status infeasible; never evaluated or selected)
        population <- elite + tournament(population + evaluate(children))
        history, proposer, hall of fame, logbook, observers <- this generation
"""
from __future__ import annotations

import contextlib
import random
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Sequence

from deap import base, tools

from . import accounting
from .agreement import agreement
from .config import SearchConfig, StopConfig
from .history import History, Record
from .protocols import Evaluator, GenerationStats, Observer, Retimes, RunSummary, throughput
from .types import Candidate, EvalResult, GeneSpace, Genome, Status
from .variation import Proposer, initial_population, seeded_global_random


class FitnessMax(base.Fitness):
    weights = (1.0,)   # fitness is a speedup over the baseline: higher is better


class Individual:
    """What DEAP's tools select among: a candidate, its result and a DEAP fitness."""

    def __init__(self, candidate: Candidate, result: EvalResult):
        self.candidate, self.result = candidate, result
        self.fitness = FitnessMax((result.fitness,))


@dataclass
class Budget:
    """The stopping rules, checked after every generation; spent() names the first rule that holds."""

    search: SearchConfig
    stop: StopConfig
    started: float
    best: float = 0.0           # the best fitness so far, and the generation that first reached it (patience)
    best_generation: int = 0

    def spent(self, state: "RunState") -> str | None:
        s, stop, generation = self.search, self.stop, state.generation
        best = state.hof[0].fitness.values[0] if len(state.hof) else 0.0
        if best > self.best:
            self.best, self.best_generation = best, generation
        wall = time.monotonic() - self.started
        rules = [("target_fitness", stop.target_fitness is not None and best >= stop.target_fitness),
                 ("patience", stop.patience is not None and generation - self.best_generation >= stop.patience),
                 ("wall_clock", any(w is not None and wall >= w for w in (stop.wall_clock_s, s.wall_clock_s))),
                 ("gpu_seconds", stop.gpu_s is not None and state.gpu_s() >= stop.gpu_s),
                 ("max_evaluations", s.max_evaluations is not None and len(state.seen) >= s.max_evaluations),
                 ("generations", generation >= s.generations)]
        return next((name for name, holds in rules if holds), None)


class RunState:
    """What the run has seen so far, and the bookkeeping after each evaluation and each generation."""

    def __init__(self, evaluator: Evaluator, observers: Sequence[Observer], proposer: Proposer,
                 history: History, search: SearchConfig, run_id: str, stop: StopConfig | None = None):
        self.evaluator, self.observers, self.proposer, self.history = evaluator, observers, proposer, history
        self.search, self.run_id = search, run_id
        self.budget = Budget(search, stop or StopConfig(), time.monotonic())
        self.generation = 0
        self.hof = tools.HallOfFame(search.hall_of_fame, similar=lambda a, b: a.candidate.id == b.candidate.id)
        self.logbook = tools.Logbook()
        self.seen: dict[str, Individual] = {}
        self.new: list[Individual] = []
        self.refused: set[str] = set()

    def evaluate(self, batch: list[Candidate], generation: int) -> list[Individual]:
        if self.search.max_evaluations is not None:
            batch = batch[:max(0, self.search.max_evaluations - len(self.seen))]
        todo = [c for c in batch if c.failure is None]    # operators' known failures skip the evaluator
        answered = dict(zip((c.id for c in todo), self.evaluator.evaluate(todo) if todo else []))
        results = [answered[c.id] if c.failure is None else operator_failure(c) for c in batch]
        return self.record(batch, results, generation)

    def record(self, batch: Sequence[Candidate], results: Sequence[EvalResult], generation: int) -> list[Individual]:
        """Hall of fame, history and observers learn of these results (steady.py records one child at a time)."""
        with whole():
            self.new = [Individual(c, r) for c, r in zip(batch, results)]
            self.seen.update((ind.candidate.id, ind) for ind in self.new)
            self.hof.update(self.new)
            self.history.add(Record.of(i.candidate, i.result, self.run_id) for i in self.new)
            for obs in self.observers:
                obs.on_results(generation, [(i.candidate, i.result) for i in self.new])
        return self.new

    def report_refused(self, refused: Sequence[Candidate], generation: int) -> None:
        """Observers see each child the rule refused once, with the rule's reason. A refusal is no evaluation:
        it stays out of the hall of fame, the population, the history (the rule already is its lesson) and
        the evaluation budget, so the search goes exactly as it would without it."""
        fresh = [c for c in dict((c.id, c) for c in refused).values()
                 if c.id not in self.seen and c.id not in self.refused]
        with whole():
            self.refused.update(c.id for c in fresh)
            for obs in self.observers if fresh else ():
                obs.on_results(generation, [(c, operator_failure(c, "rule")) for c in fresh])

    def gpu_s(self) -> float:
        return sum(i.result.gpu_s for i in self.seen.values())

    def close_generation(self, generation: int, population: list[Individual]) -> None:
        self.generation = generation
        self.proposer.update(self.history, [(i.candidate, i.result) for i in self.new])
        fits = [i.result.fitness for i in self.seen.values()]
        best = self.hof[0] if len(self.hof) else None
        stats = GenerationStats(generation, len(self.seen), best.fitness.values[0] if best else 0.0,
                                statistics.median(fits) if fits else 0.0, best.candidate.id if best else "",
                                dict(Counter(i.result.status.value for i in self.new)),
                                time.monotonic() - self.budget.started, dict(self.proposer.probabilities),
                                len(self.proposer.lessons), tuple(i.candidate.id for i in population))
        self.logbook.record(gen=generation, evals=len(self.seen), new=len(self.new), best=stats.best_fitness,
                            median=stats.median_fitness, **stats.counts)
        for obs in self.observers:
            obs.on_generation(stats)

    def summary(self, generation: int, stop: str) -> RunSummary:
        hof = [(i.candidate, i.result) for i in self.hof]
        best = hof[0] if hof and hof[0][1].fitness > 0 else None
        results = [i.result for i in self.seen.values()]
        return RunSummary(self.run_id, generation, len(self.seen), stop, time.monotonic() - self.budget.started,
                          sum(r.gpu_s for r in results), best, tuple(hof), tuple(self.logbook),
                          timed_per_gpu_minute=throughput(results),
                          accounting=accounting.of(self.evaluator, [(i.candidate, i.result) for i in
                                                                    self.seen.values()], time.monotonic() -
                                                   self.budget.started))

    def elite(self, pool: list[Individual]) -> list[Individual]:
        """The best by fitness, plus (per-case elites) the fastest correct candidate of every benchmark case."""
        elite = tools.selBest(pool, self.search.elitism)
        if self.search.per_case_elites:
            for case in sorted({k for i in pool for k in i.result.times_us}):
                timed = [i for i in pool if case in i.result.times_us]
                champion = min(timed, key=lambda i: i.result.times_us[case])
                if champion not in elite:
                    elite.append(champion)
        return elite[:self.search.population]


def operator_failure(c: Candidate, by: str = "operator") -> EvalResult:
    """An operator (or the problem's rule) already knows this child fails, e.g. an LLM edit that did not apply:
    never evaluated."""
    assert c.failure is not None
    return EvalResult(c.id, Status(c.failure[0]), message=c.failure[1], evaluator=by)


@contextlib.contextmanager
def whole():
    """Ctrl-C or SIGTERM waits for the block to end: a result is told to every observer (the journal, MLflow) and
    counted in the run's summary, or to none of them. The signal's own handler runs when the block ends."""
    caught: list[int] = []
    names = (signal.SIGINT, signal.SIGTERM)
    try:
        previous = {n: signal.signal(n, lambda signum, frame: caught.append(signum)) for n in names}
    except ValueError:   # not the main thread: signals reach only the main one
        yield
        return
    try:
        yield
    finally:
        for n, handler in previous.items():
            signal.signal(n, handler)
        for n in dict.fromkeys(caught):
            signal.raise_signal(n)


def case_champions(individuals: Sequence[Individual]) -> list[Candidate]:
    """The fastest correct candidate of each benchmark case, in case order, without repeats."""
    out: dict[str, Candidate] = {}
    for case in sorted({k for i in individuals for k in i.result.times_us}):
        best = min((i for i in individuals if case in i.result.times_us), key=lambda i: i.result.times_us[case])
        out.setdefault(best.candidate.id, best.candidate)
    return list(out.values())


def evolve(space: GeneSpace, proposer: Proposer, evaluator: Evaluator, observers: Sequence[Observer],
           search: SearchConfig, rng: random.Random, run_id: str, history: History | None = None,
           seeds: Sequence[Genome] = (), stop: StopConfig | None = None) -> RunSummary:
    state = RunState(evaluator, observers, proposer, history or History(), search, run_id, stop)
    try:
        stop = _generations(space, proposer, state, search, rng, seeds)
    except KeyboardInterrupt as exc:   # Ctrl-C or SIGTERM: what was measured so far is the run's outcome
        raise Interrupted(state.summary(state.generation, "interrupted")) from exc
    summary = state.summary(state.generation, stop)
    return replace(summary, finalists=retime_finalists(evaluator, state, search))


class Interrupted(Exception):
    """A run stopped by Ctrl-C or SIGTERM; `summary` holds what it measured (its __cause__ is the interrupt)."""

    def __init__(self, summary: RunSummary):
        super().__init__("interrupted")
        self.summary = summary


def _generations(space: GeneSpace, proposer: Proposer, state: RunState, search: SearchConfig, rng: random.Random,
                 seeds: Sequence[Genome]) -> str:
    population = state.evaluate(initial_population(space, search.population, search.init_random, rng, seeds), 0)
    state.close_generation(0, population)
    generation, stop = 0, state.budget.spent(state)
    while stop is None:
        generation += 1
        with seeded_global_random(rng):
            parents = tools.selTournament(population, search.population, search.tournament_size)
        children = proposer.propose([p.candidate for p in parents], search.population, set(state.seen),
                                    generation, rng)
        state.report_refused(proposer.refused, generation)
        if not children:
            stop = "space_exhausted"
            break
        pool = population + state.evaluate(children, generation)
        elite = state.elite(pool)
        rest = [ind for ind in pool if ind not in elite]
        with seeded_global_random(rng):
            population = elite + tools.selTournament(rest, search.population - len(elite), search.tournament_size)
        state.close_generation(generation, population)
        stop = state.budget.spent(state)
    return stop


def retime_finalists(evaluator: Evaluator, state: RunState, search: SearchConfig) -> tuple:
    """Re-time the top of the hall of fame (and, per case, each case's champion) where the evaluator can."""
    if not isinstance(evaluator, Retimes) or search.finalists == 0:
        return ()
    chosen = [i.candidate for i in list(state.hof)[:search.finalists] if i.result.fitness > 0]
    if search.per_case_elites:
        chosen += [c for c in case_champions(list(state.seen.values())) if c not in chosen]
    return tuple(agreement(rec, state.seen[rec["candidate_id"]].result) if rec["candidate_id"] in state.seen
                 else rec for rec in evaluator.retime(chosen))
