"""The dispatch rules a workload campaign learns, on the CPU: a tree recovers a split the data holds, nearest shapes
vote with their slowdowns, each rule's fit on training shapes left out of its learning, and the rule's structure
checks and the op's table reading it."""
from __future__ import annotations

import json
import math
import random
import re

import pytest

from kernel_factory.evo.tools import learn, workload as campaign
from kernel_factory.evo.types import Case, Genome
from kernel_factory.kernels import dispatch_rule
from kernel_factory.kernels.table import Table, TableError
from kernel_factory.problems.rmsnorm_fwd import problem as fwd


def _times(cases, best_of):
    """times where best_of(case) is 1.0x and every other genome 1.5x."""
    return {c.key: {g: (1.0 if g == best_of(c) else 1.5) for g in ("small", "wide", "odd")} for c in cases}


def test_fit_recovers_a_split_the_data_holds():
    rng = random.Random(0)
    cases = [Case((rng.randint(1, 65536), rng.randint(64, 65536)), "bfloat16") for _ in range(60)]

    def best_of(c):
        return "odd" if c.shape[1] % 8 else ("small" if c.shape[0] < 132 else "wide")
    fitted = learn.fit(_times(cases, best_of), depth=3)
    assert fitted.slowdown == pytest.approx(1.0) and fitted.worst == pytest.approx(1.0)
    unseen = [Case((rng.randint(1, 65536), rng.randint(64, 65536)), "bfloat16") for _ in range(200)]
    assert all(learn.chosen(fitted.tree, c) == best_of(c) for c in unseen)
    assert dispatch_rule.check(fitted.tree, "t") == []


def _greedy(times, cases, genomes, depth, min_leaf=2, min_gain=0.01):
    """The tree's definition, case by case: the cheapest leaf, or the cheapest split of every feature's every cut."""
    def cost(subset):
        return min((round(sum(learn._slow(times, c, g) for c in subset), 9), g) for g in genomes)
    feats = {c: learn._features(Case.parse(c)) for c in cases}
    here, leaf = cost(cases)
    best = None
    for name in dispatch_rule.FEATURES if depth else ():
        values = sorted({feats[c][name] for c in cases})
        for lo, hi in zip(values, values[1:]):
            left = [c for c in cases if feats[c][name] <= (lo + hi) / 2]
            right = [c for c in cases if c not in left]
            if min(len(left), len(right)) >= min_leaf:
                split = round(cost(left)[0] + cost(right)[0], 9)
                best = (split, name, left, right) if best is None or split < best[0] else best
    if best is None or here - best[0] <= min_gain:
        return ("leaf", leaf)
    return (best[1], _greedy(times, best[2], genomes, depth - 1), _greedy(times, best[3], genomes, depth - 1))


def _shape(tree):
    return ("leaf", tree["leaf"]) if "leaf" in tree else (tree["feature"], _shape(tree["then"]), _shape(tree["else"]))


def test_fit_is_the_greedy_tree_on_random_panels():
    """fit prices every cut at once from running sums; on random panels with gaps (genomes not measured on a
    case) it grows the tree the case-by-case definition grows."""
    rng = random.Random(7)
    for _ in range(12):
        cases = sorted({Case((rng.choice((1, 7, 64, 700, 4096, 30000)), rng.randint(64, 70000)), "float16").key
                        for _ in range(rng.randint(6, 40))})
        genomes = [f"g{i}" for i in range(rng.randint(2, 9))]
        times = {c: {g: rng.uniform(1, 3) for g in genomes if rng.random() < 0.85} or {"g0": 1.0} for c in cases}
        everything = sorted({g for row in times.values() for g in row})
        assert _shape(learn.fit(times, depth=3).tree) == _greedy(times, sorted(times), everything, 3)


def test_fit_prefers_one_leaf_when_a_split_buys_nothing():
    cases = [Case((m, 1024), "float32") for m in (1, 10, 100, 1000, 10000)]
    fitted = learn.fit({c.key: {"a": 1.0, "b": 1.2} for c in cases}, depth=4)
    assert fitted.tree["leaf"] == "a"
    # a genome never measured on a case counts as twice the best there
    fitted = learn.fit({cases[0].key: {"a": 1.0}, cases[1].key: {"b": 1.0}}, depth=0)
    assert fitted.worst == pytest.approx(2.0)


def test_nearest_shapes_vote_with_their_slowdowns_and_keep_tail_rows_apart():
    # seeded: vec_ok's weight (4) keeps odd widths apart only from shapes within that distance in (log2 M, log2 N);
    # an unseeded draw once left an odd 1x22927 nearer even shapes than any odd one
    rng = random.Random(28)

    def shape(lo, hi, odd):   # log-uniform M and N, N a whole number of 16-byte vectors or odd
        n = int(2 ** rng.uniform(lo, hi))
        return Case((int(2 ** rng.uniform(0, 16)), n | 1 if odd else max(8, n // 8 * 8)), "bfloat16")

    def best_of(c):
        return "odd" if c.shape[1] % 8 else ("small" if c.shape[1] <= 4096 else "wide")
    cases = [shape(6, 16, rng.random() < 0.3) for _ in range(200)]
    fitted = learn.fit_near(_times(cases, best_of))
    near = fitted.tree["near"]
    assert dispatch_rule.check(fitted.tree, "t") == [] and sorted(near["genomes"]) == ["odd", "small", "wide"]
    assert fitted.slowdown < 1.05 and dispatch_rule.leaves(fitted.tree) == near["genomes"]
    # away from the boundary between small and wide rows an unseen shape gets its regime's genome; an odd width
    # votes only with odd widths (vec_ok keeps them apart), wherever it lies
    for c in [shape(6, 10.5, False) for _ in range(40)] + [shape(13.5, 16, False) for _ in range(40)] + \
             [shape(6, 16, True) for _ in range(40)]:
        assert learn.chosen(fitted.tree, c) == best_of(c), c
    bad = {"near": {"k": 0, "genomes": [], "points": [{"at": [1, 2], "cost": {"a": "x"}}]}}
    problems = " ".join(dispatch_rule.check(bad, "fp16.rule"))
    assert "'k' must be" in problems and "'genomes' must" in problems and "fp16.rule.near.points[0]: 'at'" in problems
    assert "points[0]: 'cost'" in problems


def test_left_out_says_what_a_rule_does_on_cases_it_was_not_fitted_to():
    cases = [Case((m, 1024), "float32") for m in (1, 4, 16, 64, 256, 1024)]
    # every case has its own best genome: a rule fits its training set perfectly, but on a case left out it can only
    # pick another case's genome (1.25x there)
    times = {c.key: {f"g{j}": (1.0 if i == j else 1.25) for j in range(len(cases))} for i, c in enumerate(cases)}
    assert learn.fit_near(times, k=1).slowdown == pytest.approx(1.0)
    assert learn.left_out(times, learn.fit_near)[:2] == (pytest.approx(1.25), pytest.approx(1.25))
    assert learn.left_out(times, lambda t: learn.fit(t, depth=4))[0] == pytest.approx(1.25)


def test_the_left_out_report_reads_panel_files(tmp_path):
    base = fwd.space.defaults()
    genomes = [Genome.of({**base, "threads": t}) for t in (128, 256, 512)]
    cases = [f"float16:{m}x{n}" for m in (1, 64, 4096) for n in (256, 8192)]
    rng = random.Random()
    path = tmp_path / "panel-float16.jsonl"
    path.write_text("".join(json.dumps({"genome": g.to_json(), "result": {"status": "ok", "times_us": {
        c: rng.uniform(5, 50) for c in cases}}}) + "\n" for g in genomes))
    lines = campaign.left_out_report([str(path)]).splitlines()
    assert [line.split(":")[0] for line in lines] == ["panel-float16.jsonl tree", "panel-float16.jsonl near"]
    assert all(re.search(r"training \d\.\d{3}x, worst \d\.\d{3}x; left out \d\.\d{3}x, worst .*; tuned among "
                         r"the table's genomes, left out \d\.\d{3}x, worst", line) for line in lines)


def test_tuning_left_out_takes_the_best_of_the_tables_genomes():
    rng = random.Random()
    cases = [Case((m, n), "bfloat16") for m in (1, 64, 4096, 32768) for n in (128, 4096, 65536)]
    times = {c.key: {f"g{j}": rng.uniform(1, 3) for j in range(6)} for c in cases}
    logs = []
    for c in cases:
        rest = {k: v for k, v in times.items() if k != c.key}
        genomes = set(dispatch_rule.leaves(learn.fit(rest).tree)) | set(learn.winners(rest))
        logs.append(math.log(min(times[c.key][g] for g in genomes) / min(times[c.key].values())))
    tuned = learn.left_out(times, learn.fit, tuned=True)
    assert tuned[0] == pytest.approx(math.exp(sum(logs) / len(logs)))
    assert tuned[0] <= learn.left_out(times, learn.fit)[0] and tuned[1] == pytest.approx(math.exp(max(logs)))
    counts = {g: sum(min(row, key=row.get) == g for row in times.values()) for c in times for g in times[c]}
    wins = learn.winners(times)
    assert set(wins) == {g for g in counts if counts[g]} and len(wins) == len(set(wins))
    assert [counts[g] for g in wins] == sorted((counts[g] for g in wins), reverse=True)


def test_rule_structure_errors_name_the_node():
    bad = {"feature": "colour", "le": 1, "then": {"leaf": "a"}}
    problems = dispatch_rule.check(bad, "bfloat16.rule")
    assert any("colour" in p for p in problems) and any("missing 'else'" in p for p in problems)


def test_table_dispatches_by_rule_on_m_and_n(tmp_path):
    rule = {"feature": "log2_m", "le": 7.0, "then": {"leaf": "g_small", "id": 0}, "else": {"leaf": "g_big", "id": 1}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": "kernel-factory-dispatch/1", "problem": "rmsnorm_fwd",
                                "genomes": {}, "dtypes": {"bfloat16": {"rule": rule, "general": {"genome": "g_big"}}}}))
    table = Table(path, runnable=False)
    assert table.choose("bfloat16", 4096, 1) == ("g_small", "rule leaf 0")
    assert table.choose("bfloat16", 4096, 4096) == ("g_big", "rule leaf 1")
    rule["feature"] = "colour"
    path.write_text(json.dumps({"format": "kernel-factory-dispatch/1", "problem": "rmsnorm_fwd", "genomes": {},
                                "dtypes": {"bfloat16": {"rule": rule, "general": {"genome": "g_big"}}}}))
    with pytest.raises(TableError, match="colour"):
        Table(path, runnable=False)
