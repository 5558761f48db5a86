"""Does the search's fitness hold up? A finalist's fitness from the search (timed alone, against the baseline's
latest measurement) set beside its A/B re-time (candidate and baseline interleaved sample by sample, many
repetitions): their ratio, the noise band, and whether they agree. A run whose best fitness is off by more than the
noise says so, and the A/B figure is the one it reports."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .types import EvalResult

NOISE_FLOOR = 0.02   # run-to-run spread of a geomean over a few cases on one GPU, below any IQR estimate
SIGMA_PER_IQR = 1 / 1.349   # a normal sample's standard deviation per inter-quartile range


def noise_band(search: EvalResult, ab: Mapping[str, Any]) -> float:
    """The relative difference between the two figures that noise alone explains: three standard errors of the
    difference of the two log-geomeans, from each case's IQRs (search candidate, A/B candidate, A/B baseline),
    never below NOISE_FLOOR."""
    terms = []
    for key, med in ab.get("times_us", {}).items():
        parts = [(search.iqr_us.get(key, 0.0), search.times_us.get(key, 0.0)),
                 (ab.get("iqr_us", {}).get(key, 0.0), med),
                 (ab.get("baseline_iqr_us", {}).get(key, 0.0), ab.get("baseline_us", {}).get(key, 0.0))]
        terms.append(sum((SIGMA_PER_IQR * iqr / m) ** 2 for iqr, m in parts if m > 0))
    if not terms:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, 3 * math.sqrt(sum(terms)) / len(terms))


def agreement(finalist: Mapping[str, Any], search: EvalResult) -> dict[str, Any]:
    """The finalist's re-time record with the search's figure beside it: search_fitness, ab_over_search (A/B /
    search), noise (the band) and agrees (|log ratio| within the band). Records without an A/B speedup pass as is."""
    if "speedup" not in finalist or search.fitness <= 0:
        return dict(finalist)
    ratio = finalist["speedup"] / search.fitness
    band = noise_band(search, finalist)
    return {**finalist, "search_fitness": search.fitness, "ab_over_search": ratio, "noise": band,
            "agrees": abs(math.log(ratio)) <= math.log1p(band)}
