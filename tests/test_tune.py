"""First-call tuning of the exported op (kernels/tune.py, runtime.Kernels.tuned), on the CPU: the pick from timed
samples, the rounds, the choices kept on disk and shared by processes, the switches, and the decision itself on the
shipped forward table with a timer standing in for the GPU (tests/gpu/test_op_tune_gpu.py times for real)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_factory.kernels import runtime, tune
from kernel_factory.kernels.table import Table, chosen_genomes

FWD = runtime.OPS_DIR / "rmsnorm_fwd.json"


def test_the_fastest_median_wins_and_ties_go_to_the_first():
    rng = random.Random(7)
    samples = {"a": [rng.uniform(10, 11) for _ in range(5)], "b": [rng.uniform(9, 9.5) for _ in range(5)],
               "c": [rng.uniform(9, 9.5) for _ in range(4)] + [1000.0], "d": []}
    best = min(("b", "c"), key=lambda k: sorted(samples[k])[len(samples[k]) // 2])
    assert tune.fastest(samples) == best        # c's one stalled sample does not decide
    assert tune.fastest({"x": [5.0, 5.0], "y": [5.0, 5.0]}) == "x"
    assert tune.fastest({"x": [], "y": []}) is None


def test_rounds_shrink_for_slow_kernels_within_bounds():
    assert tune.rounds_for([3.0] * 20, 30.0) == tune.ROUNDS[1]          # tiny kernels: the most rounds
    assert tune.rounds_for([23000.0] * 20, 30.0) == tune.ROUNDS[0]      # 0.46 s a round: the fewest
    mid = tune.rounds_for([4000.0] * 10, 0.0)                            # 40 ms a round: 0.25 s / 40 ms
    assert mid == 6 and tune.ROUNDS[0] <= mid <= tune.ROUNDS[1]
    assert tune.rounds_for([], 0.0) == tune.ROUNDS[1]


def test_choices_persist_merge_across_writers_and_survive_a_damaged_file(tmp_path):
    path = tmp_path / "sub" / "rmsnorm_fwd-0123456789abcdef.json"
    one, two = tune.Choices(path), tune.Choices(path)
    k1, k2 = tune.Choices.key("GPU A", "bfloat16", 7, 4096), tune.Choices.key("GPU A", "float16", 1, 100)
    assert one.get(k1) is None and two.get(k2) is None        # both read the (absent) file first
    one.put(k1, "g1")
    two.put(k2, "g2")                                           # merges with what one wrote since it read
    assert json.loads(path.read_text())["picks"] == {k1: "g1", k2: "g2"}
    assert tune.Choices(path).get(k1) == "g1" and tune.Choices(path).get(k2) == "g2"
    assert not list(path.parent.glob("*.tmp"))
    path.write_text("{not json")
    assert tune.Choices(path).get(k1) is None                   # a damaged cache costs a tuning, not a call
    memory = tune.Choices(None)
    memory.put(k1, "g3")
    assert memory.get(k1) == "g3"


def test_the_cache_folder_follows_kf_tune_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("KF_TUNE_CACHE", raising=False)
    assert tune.cache_path("p", "ab" * 32, tmp_path) == tmp_path / f"p-{'ab' * 8}.json"
    monkeypatch.setenv("KF_TUNE_CACHE", str(tmp_path / "elsewhere"))
    assert tune.cache_path("p", "ab" * 32, tmp_path) == tmp_path / "elsewhere" / f"p-{'ab' * 8}.json"
    monkeypatch.setenv("KF_TUNE_CACHE", "")
    assert tune.cache_path("p", "ab" * 32, tmp_path) is None


def test_rule_only_holds_on_its_thread_and_kf_tune_0_turns_tuning_off():
    assert tune.enabled()
    with tune.rule_only():
        assert not tune.enabled()
        with tune.rule_only():
            assert not tune.enabled()
        assert not tune.enabled()
    assert tune.enabled()
    code = "from kernel_factory.kernels import tune; print(tune.enabled())"
    env = {**os.environ, "KF_TUNE": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_table_lists_every_kernel_of_a_dtype_and_its_sha():
    table = Table(FWD)
    data = json.loads(FWD.read_text())
    for dtype in table.dtypes():
        got = [k.genome for k in table.kernels_of(dtype)]
        want = [key.rsplit(":", 1)[0] for key in data["kernels"] if key.endswith(f":{dtype}")]
        assert got == want and len(got) > 1
        assert all(k.dtype == dtype and k.cubin_path.is_file() for k in table.kernels_of(dtype))
    import hashlib
    assert table.sha256 == hashlib.sha256(FWD.read_bytes()).hexdigest()


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    """The shipped forward table's Kernels on a named fake GPU, choices kept under tmp_path, never capturing."""
    monkeypatch.setenv("KF_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(tune, "capturing", lambda: False)

    def make():
        k = runtime.Kernels("rmsnorm_fwd", FWD)
        k._names[0] = "Fake GPU"
        return k
    return make


def test_tuning_times_every_kernel_of_the_dtype_and_keeps_the_fastest(kernels, tmp_path):
    k = kernels()
    m, n, dtype = 37, 5000, "bfloat16"
    rule = k.kernel(dtype, m, n)
    every = [x.genome for x in k.table.kernels_of(dtype)]
    rng = random.Random(11)
    winner = rng.choice([g for g in every if g != rule.genome])
    asked = []

    def timer(launches, device):
        asked.append((sorted(launches), device))
        for run in launches.values():
            run()
        return {g: [rng.uniform(5, 6) if g == winner else rng.uniform(7, 9) for _ in range(5)] for g in launches}

    ran = []
    pick, final = k.tuned(0, dtype, m, n, rule, lambda kern: (lambda: ran.append(kern.genome)), timer)
    assert final and pick.genome == winner and pick.dtype == dtype
    assert asked == [(sorted(every), 0)] and sorted(ran) == sorted(every)   # each candidate launched, once here
    files = list(tmp_path.glob("rmsnorm_fwd-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["picks"] == {f"Fake GPU|{dtype}|{m}|{n}": winner}

    # what a bench reads to say which kernel the op's time is: the kept pick beside the rule's, this shape only
    assert runtime.picks(dtype, m, n)["rmsnorm_fwd"] == {"kernel": winner, "rule": rule.genome}
    assert "rmsnorm_fwd" not in runtime.picks(dtype, m + 1, n)

    def no_timer(launches, device):
        raise AssertionError("a shape tuned before is not timed again")
    assert k.tuned(0, dtype, m, n, rule, lambda kern: None, no_timer)[0].genome == winner       # this process
    assert kernels().tuned(0, dtype, m, n, rule, lambda kern: None, no_timer)[0].genome == winner   # the disk


def test_a_candidate_that_cannot_load_is_skipped_and_a_failed_timing_falls_back_to_the_rule(kernels):
    k = kernels()
    rule = k.kernel("float32", 3, 77)
    broken = next(x.genome for x in k.table.kernels_of("float32") if x.genome != rule.genome)

    def runner_of(kern):
        if kern.genome == broken:
            raise runtime.LaunchError("no cubin for this GPU")
        return lambda: None
    seen = []
    k.tuned(0, "float32", 3, 77, rule, runner_of, lambda launches, d: seen.extend(launches) or {})
    assert broken not in seen and rule.genome in seen
    assert k.tuned(0, "float32", 3, 77, rule, runner_of, None)[0].genome == rule.genome   # no sample: the rule


def test_a_call_captured_into_a_graph_takes_the_rules_pick_and_keeps_nothing(kernels, monkeypatch, tmp_path):
    k = kernels()
    monkeypatch.setattr(tune, "capturing", lambda: True)
    rule = k.kernel("float16", 5, 3000)

    def no_timer(launches, device):
        raise AssertionError("a captured call is not timed")
    pick, final = k.tuned(0, "float16", 5, 3000, rule, lambda kern: (lambda: None), no_timer)
    assert pick.genome == rule.genome and not final
    assert not list(tmp_path.glob("*.json")) and not k._tuned


def _bounded_table(folder, region) -> tuple[Path, str]:
    """The shipped forward table with one bf16 tuning candidate (named nowhere else) bounded to `region`, written
    into folder (its kernels' files are not needed to list or choose them)."""
    data = json.loads(FWD.read_text())
    entry = data["dtypes"]["bfloat16"]
    rest = set(chosen_genomes({**entry, "candidates": []}))
    i, gid = next((i, c) for i, c in enumerate(entry["candidates"]) if isinstance(c, str) and c not in rest)
    entry["candidates"][i] = {"genome": gid, "where": region}
    path = folder / "rmsnorm_fwd.json"
    path.write_text(json.dumps(data))
    return path, gid


def test_a_bounded_candidate_is_timed_only_on_calls_inside_its_region(monkeypatch, tmp_path):
    path, gid = _bounded_table(tmp_path, {"feature": "log2_n", "le": 8.0})   # rows of at most 256 elements
    table = Table(path)
    everywhere = [k.genome for k in table.kernels_of("bfloat16")]
    assert gid in everywhere
    assert [k.genome for k in table.kernels_of("bfloat16", 5000, 200)] == everywhere
    assert [k.genome for k in table.kernels_of("bfloat16", 5000, 257)] == [g for g in everywhere if g != gid]
    assert [k.genome for k in table.kernels_of("float16", 5000, 257)] == [k.genome for k in Table(FWD).kernels_of(
        "float16")]                                                     # another dtype's candidates are its own
    monkeypatch.setenv("KF_TUNE_CACHE", str(tmp_path / "picks"))
    monkeypatch.setattr(tune, "capturing", lambda: False)
    k = runtime.Kernels("rmsnorm_fwd", path)
    k._names[0] = "Fake GPU"
    asked = []

    def timer(launches, device):
        asked.append(set(launches))
        return {g: [5.0 if g == gid else 9.0] * 3 for g in launches}
    for m, n in ((700, 96), (700, 4096)):
        rule = k.kernel("bfloat16", m, n)
        pick, _ = k.tuned(0, "bfloat16", m, n, rule, lambda kern: (lambda: None), timer)
        assert (pick.genome == gid) == (n <= 256) and (gid in asked[-1]) == (n <= 256)


def test_a_bounded_candidate_with_a_bad_region_names_it(tmp_path):
    from kernel_factory.kernels.table import TableError
    path, gid = _bounded_table(tmp_path, {"feature": "log2_k", "le": 8.0})
    with pytest.raises(TableError, match=r"bfloat16\.candidates\[\d+\]\.where.*log2_k"):
        Table(path)
    data = json.loads(path.read_text())
    entry = data["dtypes"]["bfloat16"]
    i = next(i for i, c in enumerate(entry["candidates"]) if not isinstance(c, str))
    entry["candidates"][i] = {"id": gid, "where": {"feature": "log2_n", "le": 8.0}}     # no "genome"
    path.write_text(json.dumps(data))
    with pytest.raises(TableError, match=rf"bfloat16\.candidates\[{i}\]: a candidate is a genome id"):
        Table(path)


def test_a_candidate_listed_for_two_regions_is_timed_in_either(tmp_path):
    path, gid = _bounded_table(tmp_path, {"feature": "log2_n", "le": 8.0})
    data = json.loads(path.read_text())
    data["dtypes"]["bfloat16"]["candidates"].append({"genome": gid, "where": {"feature": "log2_m", "le": 3.0}})
    path.write_text(json.dumps(data))
    table = Table(path)
    def timed(m, n):
        return gid in [k.genome for k in table.kernels_of("bfloat16", m, n)]
    assert timed(5000, 200) and timed(8, 4096) and not timed(5000, 4096)


def test_a_region_bounded_from_below_times_its_candidate_only_on_wide_calls(tmp_path):
    """A study of wide rows (tests/gpu/grid_study.py --grid wide) bounds its winners from below: `log2_n>=14`."""
    from kernel_factory.evo.tools.dispatch import TableError as WidenError, parse_region
    from kernel_factory.kernels.table import TableError
    region = parse_region("log2_n>=14")
    assert region == {"feature": "log2_n", "ge": 14.0}
    path, gid = _bounded_table(tmp_path, region)
    table = Table(path)
    def timed(m, n):
        return gid in [k.genome for k in table.kernels_of("bfloat16", m, n)]
    assert timed(5, 16384) and timed(1, 262144) and not timed(5000, 16383) and not timed(1, 96)
    for bad in ({"feature": "log2_n", "le": 8.0, "ge": 14.0}, {"feature": "log2_n"}, {"feature": "log2_n", "ge": "14"},
                {"feature": "log2_n", "ge": 14.0, "lt": 3}):
        path, _ = _bounded_table(tmp_path, bad)
        with pytest.raises(TableError, match=r"bfloat16\.candidates\[\d+\]\.where: a region is .*'le' or 'ge'"):
            Table(path)
    for text in ("log2_n>14", "log2_n=>14", "n>=14", "log2_n>=wide"):
        with pytest.raises(WidenError, match="FEATURE<=VALUE or FEATURE>=VALUE"):
            parse_region(text)
