"""The significance test of the search-efficiency report, on inputs whose answer is known."""
import math

import pytest

from kernel_factory.evo.tools.efficiency_stats import fewer_p_value, midranks

inf = math.inf


def test_midranks_share_the_mean_rank_of_ties():
    assert midranks([3.0, 1.0, 3.0, inf, inf, 2.0]) == ([3.5, 1.0, 3.5, 5.5, 5.5, 2.0], [1, 1, 2, 2])


def test_fully_separated_samples():
    # U = 0 of 25 pairs; z = (0 - 12.5 + 0.5) / sqrt(25 * 11 / 12): the value scipy's mannwhitneyu gives
    assert fewer_p_value([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0060929, rel=1e-4)
    assert fewer_p_value([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(0.9966923, rel=1e-6)   # the other way


def test_a_miss_is_worse_than_any_hit_and_misses_tie():
    # with ties and misses: scipy.stats.mannwhitneyu(..., alternative="less", method="asymptotic") gives 0.30657
    assert fewer_p_value([3, 5, inf, 2, 8, 8], [4, 9, inf, inf, 7, 8, 1]) == pytest.approx(0.3065734, rel=1e-5)
    assert fewer_p_value([500, 900], [inf, inf]) < fewer_p_value([500, 900], [400, 1000])


def test_identical_samples_say_nothing():
    assert fewer_p_value([5, 5, 5], [5, 5, 5]) == 1.0
    assert fewer_p_value([1, 2, 3], [1, 2, 3]) > 0.5


def test_the_report_compares_each_method_with_kt_ga():
    from kernel_factory.evo.tools.efficiency_report import against_kt
    runs = lambda hits: [{"seed": s, "hit": h, "spent": h or 40} for s, h in enumerate(hits)]
    methods = {"loop-defaults": runs([1, 2, 3, 4, 5]), "random": "not run: why", "kt-ga": runs([6, 7, None, 9, 10])}
    lines = against_kt(methods)
    assert "over 5 seeds" in lines[0]
    assert lines[4:] == [f"| loop-defaults | 0.33x | {fewer_p_value([1, 2, 3, 4, 5], [6, 7, inf, 9, 10]):.2g} |"]
