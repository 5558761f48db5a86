"""Making candidates: the first population, and each generation's children. Operators are picked by a policy
(static config weights, or a bandit on credit from history), proposals that lessons forbid are dropped, and the
surrogate screens the rest. Children are feasible and new: a duplicate of anything already evaluated never reaches
the evaluator. A child the problem's rule refuses is drawn again, and kept aside with the rule's reason (status
infeasible), so that the run can show what its operators proposed and why it was not compiled."""
from __future__ import annotations

import contextlib
import functools
import random
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, Mapping, Sequence

from . import credit, lessons
from .evaluate import render
from .config import SearchConfig
from .history import History
from .protocols import ContextOperator, MaybeUnavailable, Operator, OperatorContext, Problem, RepairOperator
from .surrogate import Surrogate, screen, upper_confidence
from .types import Candidate, EvalResult, GeneSpace, Genome, Status

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
          accept=lambda genes, rng: True, refused: list[Candidate] | None = None) -> list[Candidate]:
    """Up to n_children new candidates; each from one operator applied to randomly drawn parents. Children the
    rule refuses are appended to `refused` (once each), marked infeasible with the rule's reason."""
    children: list[Candidate] = []
    taken = set(seen)
    for _ in range(n_children):
        for _ in range(MAX_TRIES):
            op = rng.choices(operators, weights=probabilities)[0]
            chosen = [parents[rng.randrange(len(parents))] for _ in range(op.arity)]
            child = op.vary([c.genome for c in chosen], space, rng)
            if child.id in taken:
                continue
            why = space.why_infeasible(child.gene_dict)
            if why is not None:
                if refused is not None:
                    taken.add(child.id)   # drawn again later, it is neither a child nor a second refusal
                    refused.append(infeasible(Candidate(child, tuple(dict.fromkeys(c.id for c in chosen)), op.name,
                                                        generation), why))
                continue
            if not accept(child.gene_dict, rng):
                continue
            taken.add(child.id)
            children.append(Candidate(child, tuple(dict.fromkeys(c.id for c in chosen)), op.name, generation))
            break
    return children


def infeasible(child: Candidate, why: str) -> Candidate:
    """The child marked with the rule's refusal: recorded with that status and never compiled."""
    return Candidate(child.genome, child.parents, child.operator, child.generation, child.notes,
                     (Status.INFEASIBLE.value, f"refused by the problem's rule before compiling: {why}"))


class Proposer:
    """Each generation's children, steered by history: operator probabilities (static or bandit), lessons, and
    surrogate screening. update() relearns all three from the history; propose() uses them.

    Context operators (the LLM ones) are told the run's results and lessons before each generation, and each of
    their calls costs money, so they get their share of child slots without retries, oversampling or screening.
    Repair operators are not drawn: each generation first offers them the previous generation's results, and the
    repairs they choose take slots of the same child budget."""

    def __init__(self, space: GeneSpace, operators: Sequence[WeightedOperator], search: SearchConfig,
                 problem: Problem | None = None, fingerprint: Mapping[str, str] | None = None):
        self.space, self.search = space, search
        self.problem, self.fingerprint = problem, dict(fingerprint or {})
        self.repairers = [w.operator for w in operators if isinstance(w.operator, RepairOperator)]
        drawn = [w for w in operators if w.operator not in self.repairers]
        self.operators = [w.operator for w in drawn]
        total = sum(w.weight for w in drawn)
        self.static = {w.operator.name: w.weight / total for w in drawn}
        self.bandit = credit.Bandit([op.name for op in self.operators])
        self.probabilities = dict(self.static)
        self.lessons: list[lessons.Lesson] = []
        self.surrogate = Surrogate(space, search.surrogate.members)
        self.surrogate_ready = False
        self.contextual = [op for op in self.operators + self.repairers if isinstance(op, ContextOperator)]
        self.results: dict[str, tuple[Candidate, EvalResult]] = {}
        self.last: list[tuple[Candidate, EvalResult]] = []
        self.lessons_md = ""
        self.shared: dict = {}
        self.refused: list[Candidate] = []   # the last propose()'s children that the rule refused

    def update(self, history: History, new: Sequence[tuple[Candidate, EvalResult]] = ()) -> None:
        self.results.update((c.id, (c, r)) for c, r in new)
        self.last = list(new)
        if self.search.policy == "bandit":
            self.probabilities = self.bandit.probabilities(history.outcomes("current"), history.outcomes("prior"))
        if self.search.lessons:
            self.lessons = lessons.learn(history.records(), history.outcomes())
            if self.contextual:
                self.lessons_md = lessons.to_markdown(
                    self.lessons, self.problem.name, self.fingerprint.get("gpu", "?"), len(history.records()),
                    credit.report(credit.by_operator(history.outcomes())))
        if self.search.surrogate.enabled:
            self.surrogate_ready = self.surrogate.fit(history.records(), self.search.surrogate.min_history)

    def accept(self, genes: dict, rng: random.Random) -> bool:
        if not self.lessons:
            return True
        p, _ = lessons.acceptance(self.lessons, genes)
        return p >= 1.0 or rng.random() < p

    def propose(self, parents: Sequence[Candidate], n: int, seen: set[str], generation: int,
                rng: random.Random) -> list[Candidate]:
        self._attach(generation)
        self.refused = []   # rebound, not cleared: a steady-state slot's copy of the proposer keeps its own
        # An operator-known failure holds text that is not code (e.g. an edit that did not apply): never a parent.
        parents = [p for p in parents if p.failure is None]
        made = self._repairs(n, seen, generation, rng)
        if parents:
            made += self._costly(parents, n - len(made), seen | {c.id for c in made}, generation, rng)
        rest = n - len(made)
        ops = [op for op in self._available() if op not in self.contextual]
        if not parents or not ops or rest <= 0:
            return made
        s = self.search.surrogate
        wanted = int(rest * s.oversample) if s.enabled and self.surrogate_ready else rest
        probs = [self.probabilities[op.name] for op in ops]
        children = breed(parents, wanted, ops, probs, self.space, rng, seen | {c.id for c in made}, generation,
                         self.accept, self.refused)
        if wanted > rest:
            children = screen(children, rest, upper_confidence(self.surrogate, s.kappa), s.explore, rng)
        return made + children

    def _available(self) -> list[Operator]:
        return [op for op in self.operators if not (isinstance(op, MaybeUnavailable) and op.unavailable)]

    def _attach(self, generation: int) -> None:
        if not self.contextual:
            return
        context = OperatorContext(self.problem, MappingProxyType(self.results), self.lessons_md, self.fingerprint,
                                  generation, functools.partial(render.render, self.problem), self.shared)
        for op in self.contextual:
            op.attach(context)

    def _repairs(self, n: int, seen: set[str], generation: int, rng: random.Random) -> list[Candidate]:
        out: list[Candidate] = []
        for op in self.repairers:
            for failed in ([] if op.unavailable else op.choose(self.last)):
                if len(out) < n:
                    out += self._make(op, [failed], seen | {c.id for c in out}, generation, rng)
        return out

    def _costly(self, parents: Sequence[Candidate], n: int, seen: set[str], generation: int,
                rng: random.Random) -> list[Candidate]:
        """The context operators' share of n slots: every slot is drawn over all operators, and those that fall
        to a context operator get one call each (a duplicate child loses its slot to the cheap operators)."""
        ops = self._available()
        if n <= 0 or not any(op in self.contextual for op in ops):
            return []
        picks = [(op, [parents[rng.randrange(len(parents))] for _ in range(op.arity)])
                 for op in rng.choices(ops, weights=[self.probabilities[op.name] for op in ops], k=n)
                 if op in self.contextual]
        out: list[Candidate] = []
        for op in dict.fromkeys(op for op, _ in picks):
            sets = [chosen for o, chosen in picks if o is op]
            # An operator with make_many (the LLM operators) sends its calls of this generation together.
            made = op.make_many(sets, self.space, rng) if hasattr(op, "make_many") else \
                [op.make(chosen, self.space, rng) for chosen in sets]
            for chosen, child in zip(sets, made):
                out += self._keep(op, chosen, child, seen | {c.id for c in out}, generation)
        return out

    def _make(self, op: ContextOperator, chosen: Sequence[Candidate], taken: set[str], generation: int,
              rng: random.Random) -> list[Candidate]:
        return self._keep(op, chosen, op.make(chosen, self.space, rng), taken, generation)

    def _keep(self, op: ContextOperator, chosen: Sequence[Candidate], made: Candidate, taken: set[str],
              generation: int) -> list[Candidate]:
        child = Candidate(made.genome, tuple(dict.fromkeys(c.id for c in chosen)), op.name, generation, made.notes,
                          made.failure)
        if child.id in taken:
            return []
        why = self.space.why_infeasible(child.genome.gene_dict)
        if why is not None:
            if child.failure is None and all(r.id != child.id for r in self.refused):
                self.refused.append(infeasible(child, why))
            return []
        return [child]


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
