"""Learning the op's dispatch rule from measurements: a small decision tree over shape features (kernels/
dispatch_rule.py) whose leaves are genomes, fitted to minimize the geomean slowdown against each training shape's
fastest measured genome.

Splits are chosen greedily (CART-style, cost-sensitive): a node's cost is the least total log slowdown any one
genome achieves on all its cases; a split is kept when it lowers that cost by more than `min_gain` (log units) and
leaves at least `min_leaf` cases on each side. A genome not measured on a case counts there as `missing` times
slower than the best (2x), so that the tree prefers what was measured and splits where the data changes.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ...kernels import dispatch_rule
from ..types import Case
from ..workload import ELEM_BYTES

MISSING = math.log(2.0)
TIE = 9   # decimals: costs equal to these are ties, which go to the first feature, cut and genome in order


@dataclass(frozen=True)
class Fit:
    """A learned tree with what it costs on the cases it was fitted to: the geomean of (chosen / best) time."""

    tree: dict[str, Any]
    slowdown: float
    worst: float
    worst_case: str


def _slow(times: Mapping[str, Mapping[str, float]], case: str, genome: str) -> float:
    row = times[case]
    return math.log(row[genome] / min(row.values())) if genome in row else MISSING


def fit(times: Mapping[str, Mapping[str, float]], depth: int = 4, min_leaf: int = 2, min_gain: float = 0.01) -> Fit:
    """A tree for one dtype from times[case key][genome id] (µs). Every case needs at least one measured genome.

    Vectorized: one matrix of log slowdowns (case x genome), and every cut of a feature priced at once from the
    running sums of its cases sorted by that feature (a campaign's left-out learning fits one tree per case: at
    `91` cases and `58` genomes a dtype, case-by-case sums ran for more than ten minutes on a CPU)."""
    cases = sorted(c for c in times if times[c])
    if not cases:
        raise ValueError("no case has a measured genome: nothing to learn a dispatch from")
    genomes = sorted({g for c in cases for g in times[c]})
    slow = np.array([[_slow(times, c, g) for g in genomes] for c in cases])
    feats = {name: np.array([_features(Case.parse(c))[name] for c in cases]) for name in dispatch_rule.FEATURES}
    counter = iter(range(1 << 30))

    def grow(rows: np.ndarray, level: int) -> dict[str, Any]:
        sums = slow[rows].sum(axis=0).round(TIE)
        cost, leaf = float(sums.min()), genomes[int(sums.argmin())]
        best = None
        if level < depth and len(rows) >= 2 * min_leaf:
            for name in dispatch_rule.FEATURES:
                values = feats[name][rows]
                order = np.argsort(values, kind="stable")
                ranked, left = values[order], np.cumsum(slow[rows[order]], axis=0)
                # a cut after position i (between two distinct values) leaves i + 1 cases on the left
                at = np.nonzero(ranked[1:] != ranked[:-1])[0]
                at = at[(at + 1 >= min_leaf) & (len(rows) - at - 1 >= min_leaf)]
                if not len(at):
                    continue
                costs = (left[at].min(axis=1) + (left[-1] - left[at]).min(axis=1)).round(TIE)
                i = int(costs.argmin())
                if best is None or costs[i] < best[0]:
                    cut = (ranked[at[i]] + ranked[at[i] + 1]) / 2
                    best = (float(costs[i]), name, float(cut), rows[values <= cut], rows[values > cut])
        if best is None or cost - best[0] <= min_gain:
            return {"leaf": leaf, "id": next(counter), "cases": len(rows)}
        _, name, cut, left_rows, right_rows = best
        return {"feature": name, "le": round(cut, 6), "then": grow(left_rows, level + 1),
                "else": grow(right_rows, level + 1)}

    tree = grow(np.arange(len(cases)), 0)
    return Fit(tree, *score(tree, times))


def fit_near(times: Mapping[str, Mapping[str, float]], k: int = 3, vec_weight: float = 4.0) -> Fit:
    """A nearest-shapes rule (kernels/dispatch_rule.py) for one dtype: its genomes are those fastest on some
    training case, each training case a point holding every such genome's log slowdown there."""
    cases = sorted(c for c in times if times[c])
    if not cases:
        raise ValueError("no case has a measured genome: nothing to learn a dispatch from")
    genomes = sorted({min(times[c], key=times[c].get) for c in cases})
    points = []
    for c in cases:
        f, best = _features(Case.parse(c)), min(times[c].values())
        points.append({"at": [round(f["log2_m"], 4), round(f["log2_n"], 4), f["vec_ok"]],
                       "cost": {g: round(math.log(times[c][g] / best), 4) for g in genomes if g in times[c]}})
    tree = {"near": {"k": k, "vec_weight": vec_weight, "missing": round(MISSING, 4), "genomes": genomes,
                     "points": points}, "id": 0}
    return Fit(tree, *score(tree, times))


def winners(times: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Every genome fastest on some case, the most cases first (ties: the first case's order): what a table holds for
    first-call tuning (kernels/tune.py) besides the genomes its rule names, and a campaign's panel winners."""
    return [g for g, _ in Counter(min(row, key=row.get) for row in times.values() if row).most_common()]


def left_out(times: Mapping[str, Mapping[str, float]], learner: Any, tuned: bool = False) -> tuple[float, float, str]:
    """What a rule does on shapes it was not fitted to: each training case left out in turn, the rule learned from
    the rest (`learner(times)` -> Fit) picks for it; (geomean and worst of chosen / best time, the worst case). The
    training fit flatters: on 2026-12-03's forward panels a tree 1.01x to 1.04x the best on its training set was
    1.07x to 1.15x on the cases it was not fitted to. tuned=True: the op's first-call tuning instead of the rule's
    pick, i.e. the best there of every genome the table holds: the rule's and the winners of the other cases."""
    logs = []
    for case in sorted(c for c in times if times[c]):
        rest = {c: t for c, t in times.items() if c != case}
        if not any(rest.values()):
            continue
        tree = learner(rest).tree
        picks = {*dispatch_rule.leaves(tree), *winners(rest)} if tuned else {chosen(tree, Case.parse(case))}
        logs.append((min(_slow(times, case, g) for g in picks), case))
    if not logs:
        return 1.0, 1.0, ""
    worst = max(logs)
    return math.exp(sum(v for v, _ in logs) / len(logs)), math.exp(worst[0]), worst[1]


def score(tree: Mapping[str, Any], times: Mapping[str, Mapping[str, float]]) -> tuple[float, float, str]:
    """(geomean slowdown, worst slowdown, worst case) of the tree's choices against each case's fastest measured
    genome; a choice never measured on a case counts as MISSING."""
    logs = {c: _slow(times, c, chosen(tree, Case.parse(c))) for c in times if times[c]}
    worst = max(logs, key=logs.get)
    return math.exp(sum(logs.values()) / len(logs)), math.exp(logs[worst]), worst


def chosen(tree: Mapping[str, Any], case: Case) -> str:
    return dispatch_rule.choose(tree, _features(case))[0]


def _features(case: Case) -> dict[str, float]:
    return dispatch_rule.features(case.shape[0], case.shape[-1], ELEM_BYTES[case.dtype])


def times_of(results: Sequence[tuple[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """times[case key][genome id] from (genome id, times_us) pairs (a genome timed twice keeps its later time)."""
    out: dict[str, dict[str, float]] = {}
    for gid, times_us in results:
        for case, us in times_us.items():
            if us and us > 0 and math.isfinite(us):
                row = out.setdefault(case, {})
                row[gid] = us
    return out
