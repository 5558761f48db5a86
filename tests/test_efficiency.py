"""The search-efficiency benchmark's parts (counter, random search, loop harness, Kernel Tuner export and how its GA
ran), its raw result and the report rendered from it, and its command line, on CPU."""
import json
from pathlib import Path

import pytest

from kernel_factory.evo.tools import efficiency, efficiency_report

KT_MISSING = "Kernel Tuner is in the optional `bench` extra: pip install -e '.[bench]'"
ROOT = Path(__file__).resolve().parent.parent
TUNED = ("rmsnorm_fwd", "bfloat16", str(ROOT / "problems/recorded/rmsnorm_fwd-bfloat16-h200.jsonl.gz"), ())
HELD_OUT = ("softmax_fwd", "bfloat16",
            str(ROOT / "tests/plugins/kf_softmax/kf_softmax/recorded/softmax_fwd-bfloat16-h200.jsonl.gz"), ())


@pytest.fixture(scope="module")
def land():
    return efficiency.landscape(TUNED)


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
    assert efficiency_report.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert efficiency_report.quantile([1.0, 2.0, inf], 0.5) == 2.0
    assert efficiency_report.quantile([1.0, inf, inf], 0.5) == inf


def test_loop_harness_counts_what_the_loop_evaluated(land):
    assert efficiency.loop_unavailable() is None, "wire efficiency.run_loop to the loop's new signature"
    a = efficiency.loop_trial("loop-cold", 3, 40, TUNED)
    assert a == efficiency.loop_trial("loop-cold", 3, 40, TUNED)
    assert len(a.order) == len(set(a.order)) == 40 and set(a.order) <= set(land.genomes)
    full = efficiency.loop_trial("loop-full", 3, 40, TUNED)
    assert len(full.prior) == efficiency.PRIOR_EVALUATIONS and len(full.order) == 40
    wider = efficiency.loop_trial("loop-cold", 3, 40, (*TUNED[:3], (("population", 24),)))
    assert wider.order != a.order, "a population override must reach the loop"


def test_kt_cache_export_round_trips(land, tmp_path):
    pytest.importorskip("kernel_tuner", reason=KT_MISSING)
    from kernel_tuner.util import read_cache
    cache = read_cache(str(efficiency.write_kt_cache(land, tmp_path / "kt.json")), open_cache=False)
    assert len(cache["cache"]) == len(land.genomes) == 4272
    assert min(e["time"] for e in cache["cache"].values()) == pytest.approx(1.0 / land.optimum, rel=1e-12)
    assert efficiency.kt_space_size(land) == (4272, 4272), "KT must see exactly our feasible genomes"


def test_kt_ga_is_seeded_and_stops_at_its_budget(land, tmp_path):
    """On the RMSNorm space KT's GA keeps its population of 26; a budget of 60 distinct evaluations stops it."""
    pytest.importorskip("kernel_tuner", reason=KT_MISSING)
    path = efficiency.write_kt_cache(land, tmp_path / "kt.json")
    (a, ran), (b, _), (c, _) = (efficiency.kt_trial(land, path, seed, 60) for seed in (0, 0, 1))
    assert a == b and a != c
    assert len(a) == 60 and set(a) <= set(land.genomes)
    assert ran["stop"] == "max_fevals" and all(size == 26 for size, _ in ran["generations"])
    assert ran["evaluated"] >= 60


def test_kt_ga_on_a_small_space_runs_with_two_and_stops_when_its_count_reaches_the_space(tmp_path):
    """The issue: on the 40-genome softmax space KT's GA shrinks its population to 2, stops breeding once its
    evaluations (repeats included) reach 40, and makes far fewer distinct evaluations than any budget. The report
    says that, and never "> budget" for such a run."""
    pytest.importorskip("kernel_tuner", reason=KT_MISSING)
    small = efficiency.landscape(HELD_OUT)
    path = efficiency.write_kt_cache(small, tmp_path / "kt.json")
    order, ran = efficiency.kt_trial(small, path, 1, 1500)
    assert ran["generations"][0][0] == 2 and ran["generations"][-1][0] == 0 and ran["stop"] == "empty"
    assert ran["evaluated"] == len(small.fitness) and len(order) < len(small.fitness)
    data = efficiency.summarize({"kt-ga": [efficiency.Trial(order, ran=tuple(ran.items()))]}, small, HELD_OUT, 1500,
                                [1], 1, 0.0, "cmd")
    run = data["methods"]["kt-ga"][0]
    assert run["spent"] == len(order) and run["stop"] == "empty"
    text = efficiency_report.markdown(data)
    assert "> 1500" not in text and "population empty" in text and "2 x " in text
    if run["hit"] is None:
        assert f"none in {len(order)}" in text


def test_a_report_says_whether_its_recording_was_tuned_on():
    held = efficiency.landscape(HELD_OUT)
    data = efficiency.summarize({"random": [efficiency.random_trial(held, 0)]}, held, HELD_OUT, 40, [0], 1, 0.0, "c")
    text = efficiency_report.markdown(data)
    assert not data["in_sample"] and "held out" in text and "in-sample" not in text
    assert data["sha256"] in text and "Problem `softmax_fwd`" in text and HELD_OUT[2] in text
    tuned = efficiency.landscape(TUNED)
    data = efficiency.summarize({"random": [efficiency.random_trial(tuned, 0)]}, tuned, TUNED, 40, [0], 1, 0.0, "c")
    assert data["in_sample"] and "in-sample, not a held-out measure" in efficiency_report.markdown(data)


def test_a_small_case_gives_pinned_numbers():
    """Softmax bf16, seeds 0-1, budget 30: every number of the table is reproducible from the seeds alone."""
    land = efficiency.landscape(HELD_OUT)
    assert len(land.fitness) == 40 and sum(f >= land.target for f in land.fitness.values()) == 1
    results = {"random": [efficiency.random_trial(land, s) for s in (0, 1)],
               "loop-cold": [efficiency.loop_trial("loop-cold", s, 30, HELD_OUT) for s in (0, 1)]}
    data = efficiency.summarize(results, land, HELD_OUT, 30, [0, 1], 1, 0.0, "cmd")
    assert data["methods"]["random"] == [{"seed": 0, "hit": 21, "spent": 30}, {"seed": 1, "hit": None, "spent": 30}]
    assert [r["hit"] for r in data["methods"]["loop-cold"]] == [3, 15]
    lines = efficiency_report.table(data["methods"])
    assert "| loop-cold | 9 | 6 to 12 | 3 to 15 | 2/2 | 30 | n/a | n/a |" in lines
    assert "| 1 | none in 30 | 15 |" in lines


def test_the_command_names_its_problem_and_recording_and_never_overwrites(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        efficiency.main(["--seeds", "1", "--methods", "random"])
    assert stop.value.code == 2 and "--problem, --dtype, --recording required" in capsys.readouterr().err
    existing = tmp_path / "table.md"
    existing.write_text("committed evidence")
    args = ["--problem", HELD_OUT[0], "--dtype", HELD_OUT[1], "--recording", HELD_OUT[2], "--methods", "random",
            "--seeds", "2", "--jobs", "1"]
    assert efficiency.main([*args, "--out", str(existing)]) == 2
    assert existing.read_text() == "committed evidence" and "never overwrites" in capsys.readouterr().err


def test_the_report_renders_again_from_its_raw_json(tmp_path, capsys):
    out = tmp_path / "report.md"
    args = ["--problem", HELD_OUT[0], "--dtype", HELD_OUT[1], "--recording", HELD_OUT[2], "--methods",
            "random,loop-cold", "--seeds", "2", "--budget", "30", "--jobs", "1", "--out", str(out)]
    assert efficiency.main(args) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["command"].endswith(" ".join(args)) and data["recording"] == HELD_OUT[2]
    again = tmp_path / "again.md"
    assert efficiency.main(["--from", str(out.with_suffix(".json")), "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()
    data["methods"]["random"][0]["hit"] += 1   # one raw number changed: the report is another
    assert efficiency_report.markdown(data) != out.read_text()
    capsys.readouterr()
    assert efficiency.main(["--from", str(out)]) == 2   # the markdown is not the raw result
    err = capsys.readouterr().err
    assert "not a search-efficiency result" in err and "Traceback" not in err


def test_a_sampled_recording_is_refused_with_what_to_record_instead(tmp_path, capsys):
    """A recording of a uniform sample (as `record --sample` makes): a landscape no method can search (few
    neighbours measured), so the benchmark says so and how to record one it can, and writes nothing."""
    from conftest import write_synthetic_recording
    from kernel_factory.evo.types import Case
    from kernel_factory.problems.rmsnorm_fwd import problem
    cases = [Case(s, "bfloat16") for s in problem.shape_sets["benchmark"]]
    sample = write_synthetic_recording(tmp_path / "rmsnorm_fwd-bfloat16-sample.jsonl.gz", problem, cases,
                                       choices={"threads": [256], "load": ["nc"], "cluster": [1], "stage": ["none"]},
                                       sampling="uniform random sample of 40 of 60640 feasible genomes")
    out = tmp_path / "report.md"
    assert efficiency.main(["--problem", "rmsnorm_fwd", "--dtype", "bfloat16", "--recording", str(sample),
                            "--seeds", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "uniform random sample of 40" in err and "search.space" in err and not out.exists()


def test_a_recording_of_a_few_workload_rows_is_searched_on_those_rows(tmp_path, capsys):
    """A recording made on shapes of its own (the held-out fp16 one: four workload rows, not the benchmark set) is
    replayed on exactly its cases, and a dtype it never measured is named as such."""
    from conftest import write_synthetic_recording
    from kernel_factory.evo.types import Case
    from kernel_factory.problems.rmsnorm_fwd import problem
    cases = [Case(s, "float16") for s in ((64, 5120), (4096, 8192))]
    path = write_synthetic_recording(tmp_path / "rmsnorm_fwd-float16-rows.jsonl.gz", problem, cases,
                                     choices={"threads": [256, 512], "load": ["nc"], "cluster": [1], "stage": ["none"],
                                              "rows_per_cta": [1, 2], "unroll": [1, 2]})
    assert efficiency.recorded_shapes(str(path), "float16") == "64x5120,4096x8192"
    source = ("rmsnorm_fwd", "float16", str(path), ())
    assert [c.key for c in efficiency.replay(source)[0].cases] == [c.key for c in cases]
    with pytest.raises(efficiency.ReplayError, match="measured no bfloat16 case"):
        efficiency.recorded_shapes(str(path), "bfloat16")
    out = tmp_path / "report.md"
    assert efficiency.main(["--problem", "rmsnorm_fwd", "--dtype", "float16", "--recording", str(path),
                            "--methods", "random", "--seeds", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    assert out.exists() and "64x5120" not in capsys.readouterr().err


def test_workers_get_one_blas_thread_and_this_process_keeps_its_settings(monkeypatch):
    import os
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with efficiency.one_blas_thread():
        assert all(os.environ[name] == "1" for name in efficiency.BLAS_THREADS)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4" and "OMP_NUM_THREADS" not in os.environ
