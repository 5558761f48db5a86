"""Making candidates: the first population, and children bred from parents by weighted operators. Children are
feasible and new: a duplicate of anything already evaluated never reaches the evaluator."""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Iterator, Sequence

from kernel_factory.evo.protocols import Operator
from kernel_factory.evo.types import Candidate, GeneSpace, Genome

MAX_TRIES = 30   # attempts to breed one feasible, unseen child before giving up on that slot


@dataclass(frozen=True)
class WeightedOperator:
    operator: Operator
    weight: float


def random_genome(space: GeneSpace, rng: random.Random) -> Genome | None:
    for _ in range(MAX_TRIES * 10):
        genes = {g.name: rng.choice(g.choices) for g in space.genes}
        if space.why_infeasible(genes) is None:
            return Genome.of(genes)
    return None


def initial_population(space: GeneSpace, size: int, init_random: float, rng: random.Random,
                       seeds: Sequence[Genome] = ()) -> list[Candidate]:
    """Given seed genomes first (e.g. warm start), then the template defaults, then random feasible genomes."""
    out: dict[str, Candidate] = {}
    for genome in seeds:
        out.setdefault(genome.id, Candidate(genome, operator="seed"))
    defaults = Genome.of(space.defaults())
    if space.why_infeasible(defaults.gene_dict) is None:
        out.setdefault(defaults.id, Candidate(defaults, operator="defaults"))
    n_random = max(0, size - len(out)) if init_random > 0 else 0
    for _ in range(n_random * MAX_TRIES):
        if len(out) >= size:
            break
        genome = random_genome(space, rng)
        if genome is not None:
            out.setdefault(genome.id, Candidate(genome, operator="random"))
    return list(out.values())[:size]


def pick_operator(operators: Sequence[WeightedOperator], rng: random.Random) -> Operator:
    return rng.choices([w.operator for w in operators], weights=[w.weight for w in operators])[0]


def breed(parents: Sequence[Candidate], n_children: int, operators: Sequence[WeightedOperator],
          space: GeneSpace, rng: random.Random, seen: set[str], generation: int) -> list[Candidate]:
    """Up to n_children new candidates; each from one operator applied to randomly drawn parents."""
    children: list[Candidate] = []
    taken = set(seen)
    for _ in range(n_children):
        for _ in range(MAX_TRIES):
            op = pick_operator(operators, rng)
            chosen = [parents[rng.randrange(len(parents))] for _ in range(op.arity)]
            child = op.vary([c.genome for c in chosen], space, rng)
            if child.id in taken or space.why_infeasible(child.gene_dict) is not None:
                continue
            taken.add(child.id)
            children.append(Candidate(child, tuple(dict.fromkeys(c.id for c in chosen)), op.name, generation))
            break
    return children


@contextlib.contextmanager
def seeded_global_random(rng: random.Random) -> Iterator[None]:
    """DEAP's selection tools draw from the global `random` module. Seed it from the run's rng for the call and
    restore it afterwards, so that a run is reproducible from its seed and nobody else's randomness is touched."""
    state = random.getstate()
    random.seed(rng.randrange(2**63))
    try:
        yield
    finally:
        random.setstate(state)
