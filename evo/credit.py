"""Operator credit: outcome rates per operator and per mutated gene (compile error, incorrect, crashed, improved,
fitness change), and a UCB1 bandit that shifts operator choice toward improvement per GPU-second."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .history import Outcome
from .types import Status

FAILURES = (Status.COMPILE_ERROR, Status.INCORRECT, Status.CRASHED, Status.TIMEOUT)
GPU_S_FLOOR = 0.01     # a compile error costs no GPU time; this keeps its (zero) reward rate finite


@dataclass
class Tally:
    n: float = 0.0
    improved: float = 0.0
    gain: float = 0.0              # summed log-fitness gain over the best parent
    delta: float = 0.0             # summed fitness change (successful children of successful parents)
    delta_n: float = 0.0
    gpu_s: float = 0.0
    failures: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, o: Outcome, weight: float = 1.0) -> None:
        self.n += weight
        self.improved += weight * o.improved
        self.gain += weight * o.gain
        self.gpu_s += weight * max(o.record.gpu_s, GPU_S_FLOOR)
        if o.record.status in FAILURES:
            self.failures[o.record.status.value] += weight
        elif o.parent_fitness > 0:
            self.delta += weight * o.delta
            self.delta_n += weight

    def rates(self) -> dict[str, float]:
        n = max(self.n, 1e-9)
        out = {f"rate_{s.value}": self.failures.get(s.value, 0.0) / n for s in FAILURES}
        out.update(rate_improved=self.improved / n, mean_delta=self.delta / max(self.delta_n, 1e-9),
                   gain_per_gpu_s=self.gain / max(self.gpu_s, 1e-9), n=self.n)
        return out


def by_operator(outcomes: Iterable[Outcome], weight: float = 1.0,
                into: dict[str, Tally] | None = None) -> dict[str, Tally]:
    tallies = into if into is not None else defaultdict(Tally)
    for o in outcomes:
        tallies[o.record.operator].add(o, weight)
    return tallies


def by_gene(outcomes: Iterable[Outcome], operators: Sequence[str] = ("gene_mutation", "ptx_mutation")
            ) -> dict[str, Tally]:
    """Each mutated gene shares the credit (or blame) of the child it changed."""
    tallies: dict[str, Tally] = defaultdict(Tally)
    for o in outcomes:
        if o.record.operator in operators and o.changed:
            for gene in o.changed:
                tallies[gene].add(o, 1.0 / len(o.changed))
    return tallies


class Bandit:
    """UCB1 over operators. Reward rate = log-fitness gain per GPU-second, normalised by the best operator's rate.
    Earlier runs count with `prior_weight`; every operator keeps at least `floor` probability, so none starves."""

    def __init__(self, names: Sequence[str], prior_weight: float = 0.5, floor: float = 0.05):
        self.names = list(names)
        self.prior_weight = prior_weight
        self.floor = min(floor, 1.0 / max(len(names), 1))

    def probabilities(self, current: Sequence[Outcome], prior: Sequence[Outcome] = ()) -> dict[str, float]:
        tallies = by_operator(prior, self.prior_weight)
        by_operator(current, 1.0, tallies)
        counts = {k: tallies[k].n if k in tallies else 0.0 for k in self.names}
        if any(c < 1.0 for c in counts.values()):
            return {k: 1.0 / len(self.names) for k in self.names}   # try everything first
        rates = {k: tallies[k].gain / max(tallies[k].gpu_s, 1e-9) for k in self.names}
        top = max(rates.values())
        total = sum(counts.values())
        score = {k: (rates[k] / top if top > 0 else 0.0) + math.sqrt(2 * math.log(total) / counts[k])
                 for k in self.names}
        norm = sum(score.values())
        spare = 1.0 - self.floor * len(self.names)
        return {k: self.floor + spare * score[k] / norm for k in self.names}


def report(tallies: Mapping[str, Tally]) -> list[str]:
    """One markdown table row per key, most used first."""
    rows = []
    for key, t in sorted(tallies.items(), key=lambda kv: -kv[1].n):
        r = t.rates()
        rows.append(f"| {key} | {t.n:.0f} | {r['rate_improved']:.0%} | {r['rate_compile_error']:.0%} | "
                    f"{r['rate_incorrect']:.0%} | {r['rate_crashed'] + r['rate_timeout']:.0%} | "
                    f"{r['mean_delta']:+.4f} | {r['gain_per_gpu_s']:.3f} |")
    return rows
