"""Steady-state (asynchronous) evolution, `search.mode: steady`: no generation waits for its slowest candidate or
LLM reply. A window of `workers.in_flight` slots is kept full; each slot breeds one child (LLM operators at most
`workers.llm_concurrency` at once) and has it evaluated, while the other slots' children are timed on the workers.

    population <- evaluate(first population)                            (as in loop.py)
    fill the window: each slot <- breed one child from tournament(population), then evaluate it
    repeat until a budget is spent:
        take the OLDEST slot's result; record it; the child replaces the worst non-elite member
        every `population` results: history, proposer, hall of fame, observers <- a "generation"
        refill the window

Results are taken in the order the slots were opened, not the order they finish, and each slot breeds from a
snapshot of the proposer and the ids recorded so far: the run is the same for any number of workers, only faster.
A child that duplicates one bred in a concurrent slot is answered by the evaluator's pool once and recorded once."""
from __future__ import annotations

import copy
import random
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Sequence

from deap import tools

from .config import SearchConfig, WorkersConfig
from .history import History
from .loop import Individual, RunState, operator_failure, retime_finalists
from .protocols import Evaluator, Observer, RunSummary
from .types import Candidate, EvalResult, GeneSpace, Genome
from .variation import Proposer, initial_population, seeded_global_random

MAX_EMPTY = 200   # consecutive slots that bred nothing new before the space counts as exhausted


def breed_and_evaluate(proposer: Proposer, parents: list[Candidate], seen: frozenset[str], generation: int,
                       rng: random.Random, evaluator: Evaluator,
                       llm: threading.Semaphore) -> tuple[Candidate | None, EvalResult | None]:
    """One slot, on a thread: one child (LLM calls bounded by `llm`), then its result."""
    with llm:
        children = proposer.propose(parents, 1, set(seen), generation, rng)
    if not children:
        return None, None
    child = children[0]
    return child, operator_failure(child) if child.failure is not None else evaluator.evaluate([child])[0]


def snapshot(proposer: Proposer) -> Proposer:
    """What a slot breeds with: the proposer as it is now (update() rebinds what it relearns; the surrogate is
    refitted in place, so it is copied)."""
    snap = copy.copy(proposer)
    if proposer.search.surrogate.enabled:
        snap.surrogate = copy.deepcopy(proposer.surrogate)
    return snap


def replace_worst(state: RunState, pool: list[Individual], size: int) -> list[Individual]:
    if len(pool) <= size:
        return pool
    keep = state.elite(pool)
    worst = min((i for i in pool if i not in keep), key=lambda i: i.result.fitness)
    return [i for i in pool if i is not worst]


def evolve_steady(space: GeneSpace, proposer: Proposer, evaluator: Evaluator, observers: Sequence[Observer],
                  search: SearchConfig, workers: WorkersConfig, rng: random.Random, run_id: str,
                  history: History | None = None, seeds: Sequence[Genome] = ()) -> RunSummary:
    state = RunState(evaluator, observers, proposer, history or History(), search, run_id)
    population = state.evaluate(initial_population(space, search.population, search.init_random, rng, seeds), 0)
    state.close_generation(0, population)
    generation, fresh, empty, stop = 0, [], 0, state.budget.spent(state)
    window, llm = workers.in_flight or search.population, threading.Semaphore(workers.llm_concurrency)
    slots: deque[Future] = deque()
    with ThreadPoolExecutor(window, thread_name_prefix="kf-slot") as threads:
        while stop is None:
            while len(slots) < window and (search.max_evaluations is None
                                           or len(state.seen) + len(slots) < search.max_evaluations):
                with seeded_global_random(rng):
                    parents = tools.selTournament(population, search.population, search.tournament_size)
                slots.append(threads.submit(breed_and_evaluate, snapshot(proposer), [p.candidate for p in parents],
                                            frozenset(state.seen), generation + 1,
                                            random.Random(rng.randrange(2**63)), evaluator, llm))
            if not slots:
                stop = "max_evaluations"
                break
            child, result = slots.popleft().result()
            if child is None or child.id in state.seen:
                empty += 1
                stop = "space_exhausted" if empty >= MAX_EMPTY else None
                continue
            empty = 0
            fresh += state.record([child], [result], generation + 1)
            population = replace_worst(state, population + fresh[-1:], search.population)
            if len(fresh) == search.population:
                generation += 1
                state.new, fresh = fresh, []
                state.close_generation(generation, population)
            state.generation = generation
            stop = state.budget.spent(state)
        for slot in slots:
            slot.cancel()   # slots already running finish; their results are not recorded
    summary = state.summary(generation, stop)
    return replace(summary, finalists=retime_finalists(evaluator, state, search))
