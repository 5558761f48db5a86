"""Whether one search method needs fewer evaluations than another beyond what seed-to-seed luck explains: a one-sided
Mann-Whitney U test on evaluations to target, where a run without a hit counts as worse than any hit (it is
infinite, and ties with the other method's misses). Written with the standard library: the report must render the
same from its raw JSON on any machine, and the normal approximation (tie-corrected, with continuity correction) is
what scipy's mannwhitneyu gives for samples of this size with ties."""
from __future__ import annotations

import math
from typing import Sequence


def midranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks of values, tied values sharing the mean of their ranks, and the size of each group of ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2 + 1
        ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


def fewer_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    """The one-sided p-value of "a's values tend to be smaller than b's" (Mann-Whitney U, normal approximation).
    1.0 where every value is tied: the samples then say nothing either way."""
    n_a, n_b = len(a), len(b)
    ranks, ties = midranks([*a, *b])
    u_a = sum(ranks[:n_a]) - n_a * (n_a + 1) / 2    # pairs where a's value is larger, ties counting one half
    n = n_a + n_b
    variance = n_a * n_b / 12 * (n + 1 - sum(t ** 3 - t for t in ties) / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u_a - n_a * n_b / 2 + 0.5) / math.sqrt(variance)   # + 0.5: continuity correction toward the null
    return 0.5 * math.erfc(-z / math.sqrt(2))
