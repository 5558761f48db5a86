"""Lessons: gene values and value pairs that history shows always fail to compile, are always wrong, always crash,
or never improve. Failing ones are forbidden, unhelpful ones down-weighted, and all of them are written up as a
markdown document that a person, or the LLM operator's prompt, can read."""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence

from .history import Outcome, Record
from .types import GeneValue, Status

MIN_FAILS = 3          # evaluations, all failing the same way, before a value (or pair) is forbidden
MIN_TRIES = 12         # children carrying a freshly changed value before "never improves" can be said
AVOID_ACCEPT = 0.3     # probability that a proposal carrying an avoided value is still kept
NEAR_BEST = 0.97       # a value whose best genome comes this close to the best overall is never avoided

Key = tuple[tuple[str, GeneValue], ...]


@dataclass(frozen=True)
class Lesson:
    action: str        # "forbid" or "avoid"
    reason: str        # "always compile_error" | "always incorrect" | "always crashed" | "always timeout" | "never improves"
    genes: Key
    evidence: int      # evaluations behind it

    def matches(self, genes: Mapping[str, GeneValue]) -> bool:
        return all(genes.get(k) == v for k, v in self.genes)

    def text(self) -> str:
        what = " and ".join(f"{k}={v}" for k, v in self.genes)
        return f"{self.action} {what}: {self.reason} ({self.evidence} evaluations)"


def _keys(genes: Mapping[str, GeneValue]) -> list[Key]:
    items = sorted(genes.items())
    return [(i,) for i in items] + list(itertools.combinations(items, 2))


def _failure_lessons(records: Sequence[Record]) -> list[Lesson]:
    statuses: dict[Key, dict[Status, int]] = defaultdict(lambda: defaultdict(int))
    for rec in records:
        # a patch's failure is the patch's, not the genes'; a cut candidate did not fail (it was outrun)
        if rec.patched or rec.status in (Status.NOT_RECORDED, Status.CUT):
            continue
        for key in _keys(rec.genes):
            statuses[key][rec.status] += 1
    out = []
    forbidden_singles = set()
    for key, counts in sorted(statuses.items(), key=lambda kv: (len(kv[0]), kv[0])):
        if len(counts) != 1:
            continue
        (status, n), = counts.items()
        if status is Status.OK or n < MIN_FAILS:
            continue
        if len(key) == 2 and any((item,) in forbidden_singles for item in key):
            continue   # already covered by a single-value lesson
        if len(key) == 1:
            forbidden_singles.add(key)
        out.append(Lesson("forbid", f"always {status.value}", key, n))
    return out


def _never_improves(records: Sequence[Record], outcomes: Sequence[Outcome]) -> list[Lesson]:
    tries: dict[Key, int] = defaultdict(int)
    wins: dict[Key, int] = defaultdict(int)
    for o in outcomes:
        for gene in o.changed:
            key = ((gene, o.record.genes[gene]),)
            tries[key] += 1
            wins[key] += o.improved
    best_overall = max((r.fitness for r in records), default=0.0)
    best_with: dict[Key, float] = defaultdict(float)
    for rec in records:
        for item in rec.genes.items():
            best_with[(item,)] = max(best_with[(item,)], rec.fitness)
    return [Lesson("avoid", "never improves", key, n) for key, n in sorted(tries.items())
            if n >= MIN_TRIES and wins[key] == 0 and best_with[key] < NEAR_BEST * best_overall]


def learn(records: Sequence[Record], outcomes: Sequence[Outcome]) -> list[Lesson]:
    return _failure_lessons(records) + _never_improves(records, outcomes)


def acceptance(lessons: Sequence[Lesson], genes: Mapping[str, GeneValue]) -> tuple[float, Lesson | None]:
    """Probability of keeping a proposal with these genes, and the lesson that lowered it."""
    worst: tuple[float, Lesson | None] = (1.0, None)
    for lesson in lessons:
        if lesson.matches(genes):
            p = 0.0 if lesson.action == "forbid" else AVOID_ACCEPT
            if p < worst[0]:
                worst = (p, lesson)
    return worst


def to_markdown(lessons: Sequence[Lesson], problem: str, gpu: str, records: int, credit_rows: Sequence[str],
                replay: str = "") -> str:
    """lessons.md; `replay` (protocols.replay_note) heads it when every evaluation was replayed from a recording."""
    lines = [f"# Lessons for {problem} on {gpu}" + (" (replayed)" if replay else ""), ""]
    lines += [f"> {replay}.", ""] if replay else []
    lines += [f"Learned from {records} evaluated candidates (this run and earlier runs of the same problem and GPU).",
              "", "## Forbidden (every evaluation failed the same way)", ""]
    lines += [f"- {l.text()}" for l in lessons if l.action == "forbid"] or ["- none"]
    lines += ["", f"## Avoided (kept with probability {AVOID_ACCEPT}: never improved on its parent)", ""]
    lines += [f"- {l.text()}" for l in lessons if l.action == "avoid"] or ["- none"]
    lines += ["", "## Operator credit", "",
              "| operator | children | improved | compile error | incorrect | crashed/timeout | mean fitness change "
              "| log-gain per GPU-s |", "|---|---|---|---|---|---|---|---|", *credit_rows]
    return "\n".join(lines) + "\n"
