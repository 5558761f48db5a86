"""What the factory remembers: one flat record per evaluated candidate, from this run and from earlier runs of the
same problem on the same GPU, and each child's outcome next to its best parent. Credit, lessons, the surrogate and
warm start all learn from this, so that successful and failed experiments both steer the next proposals."""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .types import Candidate, Case, EvalResult, GeneValue, Genome, Status


def cases_key(problem: str, cases: Sequence[Case], baseline: str) -> str:
    """Fitness is comparable between runs only over the same cases and baseline: this names that combination."""
    text = "|".join([problem, baseline, *sorted(c.key for c in cases)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Record:
    id: str
    genes: Mapping[str, GeneValue]
    patched: bool
    parents: tuple[str, ...]
    operator: str
    generation: int
    status: Status
    fitness: float
    gpu_s: float
    run_id: str

    @staticmethod
    def of(candidate: Candidate, result: EvalResult, run_id: str) -> "Record":
        return Record(candidate.id, candidate.genome.gene_dict, bool(candidate.genome.patch), candidate.parents,
                      candidate.operator, candidate.generation, result.status, result.fitness, result.gpu_s, run_id)

    @property
    def genome(self) -> Genome:
        """The structured part; patched records are never turned back into genomes (their code is not kept)."""
        return Genome.of(self.genes)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "genes": dict(self.genes), "parents": list(self.parents), "status": self.status.value}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Record":
        return Record(**{**data, "parents": tuple(data["parents"]), "status": Status(data["status"])})


@dataclass(frozen=True)
class Outcome:
    """A child next to its best parent: did the operator help, and what did it cost?"""

    record: Record
    parent_fitness: float
    changed: tuple[str, ...]          # genes that differ from the best parent

    @property
    def improved(self) -> bool:
        return self.record.status is Status.OK and self.record.fitness > self.parent_fitness

    @property
    def gain(self) -> float:
        """Log fitness gained over the best parent (0 when it did not improve)."""
        if not self.improved:
            return 0.0
        return math.log(self.record.fitness / self.parent_fitness) if self.parent_fitness > 0 else 1.0

    @property
    def delta(self) -> float:
        return self.record.fitness - self.parent_fitness


class History:
    """Earlier runs' records (read-only) plus this run's, in evaluation order."""

    def __init__(self, prior: Sequence[Record] = ()):
        self.prior = list(prior)   # prior.load_prior leaves out earlier runs' refusals
        self.current: list[Record] = []
        self._by_id: dict[str, Record] = {}
        # (run, candidate): the same genome has the same id in every run, but its parents are those of one run.
        self._by_run: dict[tuple[str, str], Record] = {}
        for rec in self.prior:
            self._by_id.setdefault(rec.id, rec)
            self._by_run.setdefault((rec.run_id, rec.id), rec)
        self._earliest = dict(self._by_id)   # prior is oldest run first

    def add(self, records: Iterable[Record]) -> None:
        for rec in records:
            self.current.append(rec)
            self._by_id[rec.id] = rec   # this run's measurement wins over an earlier run's
            self._by_run[(rec.run_id, rec.id)] = rec

    def bred_in(self, genome_id: str) -> Record | None:
        """The earliest earlier run's record of this genome: the run and candidate that bred it, which a warm-start
        seed links to (a later run that took it as a seed only copied it)."""
        return self._earliest.get(genome_id)

    def records(self, prior: bool = True) -> list[Record]:
        return (self.prior if prior else []) + self.current

    def outcomes(self, source: str = "all") -> list[Outcome]:
        """Every child (of `source`: all, prior or current) whose parents are known; seeds, random and default
        genomes have no parents. A parent is the child's own run's record of it (a genome recurs across runs with
        other measurements), else the genome's record in another run."""
        records = {"all": self.records(), "prior": self.prior, "current": self.current}[source]
        out = []
        for rec in records:
            parents = [self._by_run.get((rec.run_id, p)) or self._by_id[p] for p in rec.parents if p in self._by_id]
            if not parents:
                continue
            best = max(parents, key=lambda p: p.fitness)
            changed = tuple(sorted(k for k, v in rec.genes.items() if best.genes.get(k) != v))
            out.append(Outcome(rec, best.fitness, changed))
        return out

    def best(self, count: int) -> list[Record]:
        """The best distinct, successful, unpatched genomes, best first (for warm start)."""
        seen, out = set(), []
        for rec in sorted(self.records(), key=lambda r: (-r.fitness, r.id)):
            if rec.status is Status.OK and not rec.patched and rec.id not in seen:
                seen.add(rec.id)
                out.append(rec)
            if len(out) >= count:
                break
        return out
