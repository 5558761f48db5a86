"""Making candidates: the first population, and each generation's children. Operators are picked by a policy
(static config weights, or a bandit on credit from history), proposals that lessons forbid are dropped, and the
surrogate screens the rest. Children are feasible and new: a duplicate of anything already evaluated never reaches
the evaluator."""
from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Iterator, Sequence

from kernel_factory.evo import credit, lessons
from kernel_factory.evo.config import SearchConfig
from kernel_factory.evo.history import History
from kernel_factory.evo.protocols import Operator
from kernel_factory.evo.surrogate import Surrogate, screen
from kernel_factory.evo.types import Candidate, GeneSpace, Genome

MAX_TRIES = 100  # attempts to breed one feasible, unseen, accepted child before giving up on that slot


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


def breed(parents: Sequence[Candidate], n_children: int, operators: Sequence[Operator],
          probabilities: Sequence[float], space: GeneSpace, rng: random.Random, seen: set[str], generation: int,
          accept=lambda genes, rng: True) -> list[Candidate]:
    """Up to n_children new candidates; each from one operator applied to randomly drawn parents."""
    children: list[Candidate] = []
    taken = set(seen)
    for _ in range(n_children):
        for _ in range(MAX_TRIES):
            op = rng.choices(operators, weights=probabilities)[0]
            chosen = [parents[rng.randrange(len(parents))] for _ in range(op.arity)]
            child = op.vary([c.genome for c in chosen], space, rng)
            if child.id in taken or space.why_infeasible(child.gene_dict) is not None:
                continue
            if not accept(child.gene_dict, rng):
                continue
            taken.add(child.id)
            children.append(Candidate(child, tuple(dict.fromkeys(c.id for c in chosen)), op.name, generation))
            break
    return children


class Proposer:
    """Each generation's children, steered by history: operator probabilities (static or bandit), lessons, and
    surrogate screening. update() relearns all three from the history; propose() uses them."""

    def __init__(self, space: GeneSpace, operators: Sequence[WeightedOperator], search: SearchConfig):
        self.space, self.search = space, search
        self.operators = [w.operator for w in operators]
        total = sum(w.weight for w in operators)
        self.static = {w.operator.name: w.weight / total for w in operators}
        self.bandit = credit.Bandit([op.name for op in self.operators])
        self.probabilities = dict(self.static)
        self.lessons: list[lessons.Lesson] = []
        self.surrogate = Surrogate(space)
        self.surrogate_ready = False

    def update(self, history: History) -> None:
        if self.search.policy == "bandit":
            self.probabilities = self.bandit.probabilities(history.outcomes("current"), history.outcomes("prior"))
        if self.search.lessons:
            self.lessons = lessons.learn(history.records(), history.outcomes())
        if self.search.surrogate.enabled:
            self.surrogate_ready = self.surrogate.fit(history.records(), self.search.surrogate.min_history)

    def accept(self, genes: dict, rng: random.Random) -> bool:
        if not self.lessons:
            return True
        p, _ = lessons.acceptance(self.lessons, genes)
        return p >= 1.0 or rng.random() < p

    def propose(self, parents: Sequence[Candidate], n: int, seen: set[str], generation: int,
                rng: random.Random) -> list[Candidate]:
        s = self.search.surrogate
        wanted = int(n * s.oversample) if s.enabled and self.surrogate_ready else n
        probs = [self.probabilities[op.name] for op in self.operators]
        children = breed(parents, wanted, self.operators, probs, self.space, rng, seen, generation, self.accept)
        if wanted > n:
            children = screen(children, n, self.surrogate, s.explore, rng)
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
