"""The search-efficiency benchmark's parts (counter, random search, loop harness, Kernel Tuner export), on CPU."""
import pytest

from kernel_factory.evo.tools import efficiency

KT_MISSING = "Kernel Tuner is in the optional `bench` extra: pip install -e '.[bench]'"


@pytest.fixture(scope="module")
def land():
    return efficiency.landscape()


def test_counter_counts_distinct_genomes_up_to_the_first_hit():
    fitness = {"a": 1.0, "b": 0.5, "c": 2.0, "d": 3.0}
    assert efficiency.evaluations_to_target(["a", "b", "a", "c", "d"], fitness, 1.9) == 3   # the repeat is free
    assert efficiency.evaluations_to_target(["d", "c"], fitness, 1.9) == 1
    assert efficiency.evaluations_to_target(["x", "c"], fitness, 2.0) == 2   # unknown: counted, never a hit
    assert efficiency.evaluations_to_target(["a", "b", "b"], fitness, 1.9) is None


def test_random_search_reaches_the_target_inside_the_space(land):
    n = len(land.fitness)
    assert n == 4272 and sum(f >= land.target for f in land.fitness.values()) >= 1
    trials = [efficiency.random_trial(land, seed) for seed in range(3)]
    assert all(sorted(t.order) == sorted(land.genomes) for t in trials), "a permutation of the feasible genomes"
    counts = [efficiency.evaluations_to_target(t.order, land.fitness, land.target) for t in trials]
    assert all(1 <= c <= n for c in counts)
    assert len(set(counts)) == 3, "seeds must give different orders"
    assert efficiency.random_trial(land, 1) == trials[1]


def test_censored_quantiles():
    inf = float("inf")
    assert efficiency.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert efficiency.quantile([1.0, 2.0, inf], 0.5) == 2.0
    assert efficiency.quantile([1.0, inf, inf], 0.5) == inf


def test_loop_harness_counts_what_the_loop_evaluated(land):
    assert efficiency.loop_unavailable() is None, "wire efficiency.run_loop to the loop's new signature"
    a = efficiency.loop_trial("loop-cold", 3, 40)
    assert a == efficiency.loop_trial("loop-cold", 3, 40)
    assert len(a.order) == len(set(a.order)) == 40 and set(a.order) <= set(land.genomes)
    full = efficiency.loop_trial("loop-full", 3, 40)
    assert len(full.prior) == efficiency.PRIOR_EVALUATIONS and len(full.order) == 40


def test_kt_cache_export_round_trips(land, tmp_path):
    pytest.importorskip("kernel_tuner", reason=KT_MISSING)
    from kernel_tuner.util import read_cache
    cache = read_cache(str(efficiency.write_kt_cache(land, tmp_path / "kt.json")), open_cache=False)
    assert len(cache["cache"]) == len(land.genomes) == 4272
    assert min(e["time"] for e in cache["cache"].values()) == pytest.approx(1.0 / land.optimum, rel=1e-12)
    assert efficiency.kt_space_size(land) == (4272, 4272), "KT must see exactly our feasible genomes"


def test_kt_ga_is_seeded_and_spends_its_budget(land, tmp_path):
    pytest.importorskip("kernel_tuner", reason=KT_MISSING)
    path = efficiency.write_kt_cache(land, tmp_path / "kt.json")
    a, b, c = (efficiency.kt_trial(land, path, seed, 60) for seed in (0, 0, 1))
    assert a == b and a != c
    assert len(a) == 60 and set(a) <= set(land.genomes)


HELD_OUT = (*efficiency.REPORT_ON, None)


def test_the_default_report_is_on_a_recording_the_settings_were_not_tuned_on():
    assert efficiency.REPORT_ON[0] != efficiency.TUNED_ON[0]
    land = efficiency.landscape(HELD_OUT)
    text = efficiency.report({"random": [efficiency.random_trial(land, 0)]}, land, 40, 1, 0.0, 1, HELD_OUT)
    assert "held out" in text and "in-sample" not in text
    tuned = efficiency.landscape()
    text = efficiency.report({"random": [efficiency.random_trial(tuned, 0)]}, tuned, 40, 1, 0.0, 1)
    assert "in-sample, not a held-out measure" in text


def test_a_small_case_gives_pinned_numbers(tmp_path):
    """Softmax bf16, seeds 0-1, budget 30: every number of the table is reproducible from the seeds alone."""
    land = efficiency.landscape(HELD_OUT)
    assert len(land.fitness) == 40 and sum(f >= land.target for f in land.fitness.values()) == 1
    results = {"random": [efficiency.random_trial(land, s) for s in (0, 1)],
               "loop-cold": [efficiency.loop_trial("loop-cold", s, 30, HELD_OUT) for s in (0, 1)]}
    cols = efficiency.columns(results, land, 30)
    inf = float("inf")
    assert cols["random"] == ([21.0, inf], [30, 30])
    assert cols["loop-cold"] == ([3.0, 16.0], [30, 30])
    lines = efficiency.table(results, land, 30)
    assert "| loop-cold | 9.5 | 6.2 to 12.8 | 3 to 16 | 2/2 | 30 | n/a | n/a |" in lines


def test_the_report_goes_to_a_new_folder_and_never_overwrites(tmp_path, monkeypatch, capsys):
    import datetime
    out = efficiency.default_out(HELD_OUT, datetime.datetime(2026, 12, 1, 21, 0, 0))
    assert out.parts[:2] == ("runs", "efficiency") and out.parent.name == "softmax_fwd-bfloat16-20261201-210000"
    existing = tmp_path / "table.md"
    existing.write_text("committed evidence")
    with pytest.raises(SystemExit):
        efficiency.main(["--out", str(existing), "--methods", "random", "--seeds", "1"])
    assert existing.read_text() == "committed evidence" and "never overwrites" in capsys.readouterr().err
