"""Racing: more candidates per GPU-minute by timing hopeless ones on the cheap cases only (config `search.racing`,
docs/racing.md).

Every candidate passes the whole gate (correctness is never cut). It is then timed on the `cases` cheapest
benchmark cases (fewest bytes moved), and cut when, on those cases, even its optimistic bound cannot reach the
`top_k`-th best fully timed candidate so far. The bound is calibrated on this run's fully timed candidates (how
far their fitness on the cheap cases was from their full fitness) plus the candidate's own timing noise:

    partial = geomean speedup over the cheap cases
    g_i     = log(full_i / partial_i) over the fully timed candidates i           (the cheap cases' bias)
    noise   = sqrt(sum over the cases of r^2) / n,  r = IQR / (1.349 t)            (a sample's relative spread)
    bound   = partial * exp(mean(g) + z(confidence) * sqrt(var(g) + noise^2))     (one-sided)
    cut     when  bound < the top_k-th best full fitness

Nothing is cut before `warmup` (and `top_k`) candidates are fully timed. That the cheap cases rank like all of them
is the race's assumption, and the calibration measures it; docs/racing.md says how the replay comparison checks it.
Survivors are timed on every case, and only they can join the top-k. A cut result has status cut, fitness 0, no
times_us, and its evidence in EvalResult.race.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import threading
from typing import Any, Mapping, Sequence

from ..agreement import SIGMA_PER_IQR
from ..config import RacingConfig
from ..protocols import EvaluatorInfo, Problem, Races, RecordedSpace, Retimes
from ..types import Candidate, Case, EvalResult, Status, geomean_speedup


def cheap_cases(problem: Problem, cases: Sequence[Case], n: int) -> tuple[str, ...]:
    """The n benchmark cases that are quickest to time (fewest bytes moved; ties in case order)."""
    ranked = sorted(enumerate(cases), key=lambda ic: (problem.bytes_moved(ic[1]), ic[0]))
    return tuple(c.key for _, c in ranked[:n])


def partial_fitness(result: EvalResult, keys: Sequence[str]) -> float:
    """The geomean speedup over `keys` alone (of a first leg, or of a full result's times on those cases)."""
    return geomean_speedup({k: result.times_us[k] for k in keys}, {k: result.baseline_us[k] for k in keys})


def residuals(full: Sequence[EvalResult], keys: Sequence[str]) -> list[float]:
    """log(full fitness / partial fitness) of fully timed candidates: how far the cheap cases mislead."""
    return [math.log(r.fitness / partial_fitness(r, keys)) for r in full]


def judge(first: EvalResult, kth: float, gaps: Sequence[float], keys: Sequence[str],
          confidence: float) -> dict[str, Any]:
    """The race's evidence for one candidate timed on `keys`: its partial fitness, the optimistic bound on its full
    fitness (one-sided at `confidence`), the threshold (the k-th best full fitness) and `cut`."""
    mine = partial_fitness(first, keys)
    relative = [SIGMA_PER_IQR * first.iqr_us.get(k, 0.0) / first.times_us[k] for k in keys]
    noise = math.sqrt(sum(r ** 2 for r in relative)) / len(keys)
    sigma = math.sqrt(statistics.pvariance(gaps) + noise ** 2)
    z = statistics.NormalDist().inv_cdf(confidence)
    bound = mine * math.exp(statistics.fmean(gaps) + z * sigma)
    return {"cases": list(keys), "times_us": {k: first.times_us[k] for k in keys},
            "iqr_us": {k: first.iqr_us.get(k, 0.0) for k in keys}, "partial_fitness": round(mine, 6),
            "bound_fitness": round(bound, 6), "threshold_fitness": round(kth, 6), "calibrated_on": len(gaps),
            "confidence": confidence, "cut": bound < kth}


def cut_result(first: EvalResult, evidence: Mapping[str, Any], total_cases: int) -> EvalResult:
    """The record of a cut candidate: gated, timed on the cheap cases, never given a fitness."""
    n = len(evidence["cases"])
    why = (f"cut by racing after {n} of {total_cases} cases: optimistic bound {evidence['bound_fitness']:.4f}x < "
           f"top-{evidence.get('top_k', '?')} threshold {evidence['threshold_fitness']:.4f}x on those cases "
           f"(one-sided, confidence {evidence['confidence']})")
    return dataclasses.replace(first, status=Status.CUT, fitness=0.0, times_us={}, iqr_us={}, gbps={},
                               message=why, race=dict(evidence))


class RacingEvaluator:
    """An Evaluator over one that Races: two legs per candidate, the second only for candidates that can still
    reach the running top-k. The top-k is of fully timed candidates of this run (a resumed run's journal included,
    through learn())."""

    def __init__(self, inner: Races, config: RacingConfig, problem: Problem, cases: Sequence[Case]):
        self.inner, self.config = inner, config
        self.info: EvaluatorInfo = inner.info   # type: ignore[attr-defined]
        self.keys = cheap_cases(problem, cases, config.cases)
        self.total = len(cases)
        self.full: list[EvalResult] = []        # every fully timed result: the top-k and the calibration
        self._lock = threading.Lock()           # steady-state search evaluates from several threads
        if isinstance(inner, RecordedSpace):
            self.space = inner.space
        if isinstance(inner, Retimes):
            self.retime = inner.retime
        if hasattr(inner, "accounting"):
            self.accounting = inner.accounting   # type: ignore[attr-defined]

    def learn(self, results: Sequence[EvalResult]) -> None:
        """Fully timed results join the race's books (a resumed run's journal too, so it races as it did)."""
        with self._lock:
            known = {r.candidate_id for r in self.full}
            self.full += [r for r in results if r.status is Status.OK and r.fitness > 0 and r.candidate_id not in known
                          and all(k in r.times_us for k in self.keys) and partial_fitness(r, self.keys) > 0]

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        return self.evaluate_known(candidates, {})

    def evaluate_known(self, candidates: Sequence[Candidate], known: Mapping[str, EvalResult]) -> list[EvalResult]:
        """Race a batch, where `known` (a resumed run's journal) answers some candidates as they ended: each takes
        its place in the race order by its first leg's figure and joins the books there, so that the rest of the
        batch races against exactly the books it met in the run that was killed."""
        todo = [c for c in candidates if c.id not in known]
        if len(self.keys) >= self.total:   # nothing to save: the cheap cases are all of them
            fresh = dict(zip((c.id for c in todo), self.inner.evaluate(todo) if todo else []))  # type: ignore
            return [known.get(c.id) or fresh[c.id] for c in candidates]
        firsts = dict(zip((c.id for c in todo), self.inner.time_first(todo, self.keys) if todo else []))
        lead = {c.id: self.lead(firsts.get(c.id) or known[c.id]) for c in candidates
                if (firsts.get(c.id) or known[c.id]).status in (Status.OK, Status.CUT)}
        # The most promising go first: once timed in full they raise the bar for the rest of the batch.
        order = sorted((c for c in candidates if c.id in lead), key=lambda c: -lead[c.id])
        out = {c.id: known.get(c.id) or firsts[c.id] for c in candidates if c.id not in lead}
        for cand in order:
            if cand.id in known:
                self.learn([known[cand.id]])
                out[cand.id] = known[cand.id]
            else:
                out[cand.id] = self._race(cand, firsts[cand.id])
        return [out[c.id] for c in candidates]

    def lead(self, result: EvalResult) -> float:
        """A candidate's place in the race order: its first leg's partial fitness as the evidence keeps it (rounded),
        so that a journal's result and a fresh first leg are ranked alike."""
        race = result.race or {}
        return race["partial_fitness"] if "partial_fitness" in race else round(partial_fitness(result, self.keys), 6)

    def _race(self, cand: Candidate, first: EvalResult) -> EvalResult:
        with self._lock:
            ready = len(self.full) >= max(self.config.warmup, self.config.top_k)
            kth = sorted((r.fitness for r in self.full), reverse=True)[self.config.top_k - 1] if ready else 0.0
            gaps = residuals(self.full, self.keys) if ready else []
        evidence = judge(first, kth, gaps, self.keys, self.config.confidence) if ready else None
        if evidence is not None and evidence["cut"]:
            return cut_result(first, {**evidence, "top_k": self.config.top_k}, self.total)
        (rest,) = self.inner.time_rest([cand], [first])
        full = dataclasses.replace(rest, gpu_s=first.gpu_s + rest.gpu_s,
                                   race={"partial_fitness": self.lead(first), **(evidence or {}), "survived": True,
                                         "first_gpu_s": first.gpu_s})
        self.learn([full])
        return full

    def close(self) -> None:
        self.inner.close()   # type: ignore[attr-defined]
