"""Paired timing's guard (evo/evaluate/paired.py): a glitch in one pair's baseline is timed again, never folded
into a fitness; a shift that every try confirms is accepted, and the usual time follows it."""
import math
import random
from types import SimpleNamespace

from kernel_factory.evo.evaluate.paired import BAND, HISTORY, HISTORY_MIN, TRIES, PairedBaselines


def pairs(baselines, rng):
    """time_pair() stand-in: yields (candidate, baseline) timings with the given baseline times, counting calls."""
    it = iter(baselines)
    calls = []

    def time_pair():
        calls.append(1)
        return SimpleNamespace(median_us=rng.uniform(100, 500)), SimpleNamespace(median_us=next(it))
    return time_pair, calls


def settle(guard, key, usual, rng, n=HISTORY):
    for _ in range(n):
        fn, calls = pairs([usual * rng.uniform(0.99, 1.01)], rng)
        guard.vetted(key, fn, usual)
        assert len(calls) == 1
    guard.take_evidence()


def test_a_glitch_in_the_paired_baseline_is_timed_again_and_the_in_band_try_is_kept():
    rng = random.Random()
    guard, key, usual = PairedBaselines(), f"bfloat16:32768x{rng.choice([4096, 8192])}", rng.uniform(200, 400)
    settle(guard, key, usual, rng)
    glitch, good = usual * rng.uniform(2.0, 6.0), usual * rng.uniform(0.99, 1.01)
    fn, calls = pairs([glitch, good], rng)
    cand, base = guard.vetted(key, fn, fallback=usual)
    assert len(calls) == 2 and base.median_us == good
    assert guard.take_evidence() == {key: [glitch, good]} and guard.take_evidence() == {}
    assert math.isclose(guard.usual(key, None), usual, rel_tol=0.02)   # the glitch never entered the history


def test_a_shift_every_try_confirms_is_accepted_and_the_usual_time_follows_it():
    rng = random.Random()
    guard, key, usual = PairedBaselines(), "float16:4096x4096", rng.uniform(20, 80)
    settle(guard, key, usual, rng)
    shifted = usual * (1 + 2 * BAND)
    retried = 0
    for _ in range(HISTORY):
        fn, calls = pairs([shifted * rng.uniform(0.999, 1.001) for _ in range(TRIES)], rng)
        _, base = guard.vetted(key, fn, fallback=usual)
        assert math.isclose(base.median_us, shifted, rel_tol=0.01) and len(calls) <= TRIES
        retried += len(calls) > 1
    assert 0 < retried <= HISTORY // 2 + 1   # until the median moves over, then no more retries
    assert math.isclose(guard.usual(key, None), shifted, rel_tol=0.01)


def test_until_the_history_fills_the_workers_own_measurement_is_the_usual_time():
    rng = random.Random()
    guard, key, usual = PairedBaselines(), "bfloat16:8x8", rng.uniform(5, 9)
    assert guard.usual(key, usual) == usual and HISTORY_MIN > 1
    fn, calls = pairs([usual * 3, usual], rng)
    assert guard.vetted(key, fn, fallback=usual)[1].median_us == usual and len(calls) == 2
    fn, calls = pairs([usual * 3], rng)   # no measurement to judge by: the first try stands
    assert PairedBaselines().vetted(key, fn, fallback=None)[1].median_us == usual * 3 and len(calls) == 1


def test_the_parent_names_the_retries_in_the_result_and_the_run_books():
    from kernel_factory.evo.evaluate.gpu import BaselineLog, GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    rng = random.Random()
    key = f"bfloat16:{rng.randrange(1, 999)}x4096"
    latest = {key: rng.uniform(10, 90)}
    fake = SimpleNamespace(problem=problem, baseline_us=latest, baselines=BaselineLog(latest))
    reply = {"status": "ok", "times_us": {key: 40.0}, "iqr_us": {key: 0.1}, "paired_baseline_us": {key: 41.0},
             "paired_retimed": {key: [190.25, 41.0]}}
    res = GpuEvaluator.result(fake, "c0", reply, {})
    assert res.baseline_us == {key: 41.0} and f"paired baseline timed again (a glitch): {key} 190.2 / 41.0 us" \
        in res.message
    books = fake.baselines.books()
    assert books["paired_retimed"] == {"candidates": 1, "first": [{key: [190.25, 41.0]}]}
    assert "paired_retimed" not in BaselineLog(latest).books()
