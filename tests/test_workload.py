"""Workloads, not benchmark rows: the seeded training / held-out draws, the buckets, the learned dispatch rule, the
op's table reading it, and a whole campaign on the CPU with a stand-in for the GPU (a deterministic cost model of
genes and shape) that records every case it was asked to time, so that "no search sees a held-out shape" is checked
on what was actually evaluated, not on the plan."""
from __future__ import annotations

import json
import math
import random
import re
import tarfile
from pathlib import Path

import pytest

from kernel_factory.evo import build, config, journal
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.protocols import EvaluatorInfo
from kernel_factory.evo.tools import learn, workload as campaign
from kernel_factory.evo.types import Case, EvalResult, Genome, Status, geomean_speedup
from kernel_factory.evo.workload import (ELEM_BYTES, Workload, bucket, by_bucket, distance, draw, narrow, split)
from kernel_factory.kernels import dispatch_rule
from kernel_factory.kernels.table import Table, TableError
from kernel_factory.problems.rmsnorm_fwd import problem as fwd


# ---- draws -----------------------------------------------------------------------------------------------------------

def test_split_is_seeded_disjoint_and_covers_what_users_run():
    w = fwd.workload
    a, b = split(w, 7, 40, 48), split(w, 7, 40, 48)
    assert a == b and split(w, 8, 40, 48) != a
    assert not set(a.train) & set(a.heldout)
    assert len(set(a.heldout)) == 48 * 3 and len(set(a.train)) == 40 * 3
    # the held-out stream does not depend on how many training shapes are drawn
    assert split(w, 7, 5, 48).heldout == a.heldout
    for dtype in w.dtypes:
        held = [c for c in a.heldout if c.dtype == dtype]
        assert sum(c.shape[0] < w.sms for c in held) >= 48 // 5          # small M, M = 1 region
        assert sum(c.shape[1] % 8 != 0 for c in held) >= 48 // 4          # widths with a vector tail
        assert all(c.shape[0] * c.shape[1] * ELEM_BYTES[dtype] <= w.max_bytes for c in held)
        assert all(w.m[0] <= c.shape[0] <= w.m[1] and w.n[0] <= c.shape[1] <= w.n[1] for c in held)


def test_draws_are_log_uniform_not_piled_on_a_bound():
    w = Workload(dtypes=("bfloat16",), small_m_share=0.0)
    ms = [c.shape[0] for c in draw(w, "bfloat16", 400, random.Random(3))]
    assert max(ms.count(m) for m in set(ms)) < 20
    decades = {int(math.log10(m)) for m in ms}
    assert decades >= {2, 3, 4}


def test_narrowing_names_what_widens():
    w = fwd.workload
    assert narrow(w, dtypes=["float16"], n=[64, 8192]).n == (64, 8192)
    with pytest.raises(ValueError, match="dtypes: 'int8'"):
        narrow(w, dtypes=["int8"])
    with pytest.raises(ValueError, match=r"n: \[1, 8192\] is wider"):
        narrow(w, n=[1, 8192])
    with pytest.raises(ValueError, match="laws"):
        narrow(w, laws={"primes": 1.0})


def test_config_rejects_bad_workload_keys():
    base = {"problem": "rmsnorm_fwd", "workload": {"train": 4}}
    assert config.parse(base).workload.train == 4
    with pytest.raises(ConfigError, match="workload.train' must be >= 1"):
        config.parse({"problem": "rmsnorm_fwd", "workload": {"train": 0}})
    with pytest.raises(ConfigError, match="workload.m' must be"):
        config.parse({"problem": "rmsnorm_fwd", "workload": {"m": [5, 1]}})
    with pytest.raises(ConfigError, match="workload.colour' is unknown"):
        config.parse({"problem": "rmsnorm_fwd", "workload": {"colour": 1}})
    cfg = config.parse({"problem": "rmsnorm_fwd", "workload": {"buckets": ["bfloat16/nowhere"]}})
    with pytest.raises(ConfigError, match="workload.buckets'.*holds no training shape"):
        campaign.plan(cfg)
    with pytest.raises(ConfigError, match="workload.dtypes"):
        campaign.plan(config.parse({"problem": "rmsnorm_fwd", "workload": {"dtypes": ["int8"]}}))
    with pytest.raises(ConfigError, match=r"workload.panel_twins.colour': rmsnorm_fwd has no gene 'colour'"):
        campaign.plan(config.parse({"problem": "rmsnorm_fwd", "workload": {"panel_twins": {"colour": 1}}}))
    with pytest.raises(ConfigError, match=r"workload.panel_twins.tail': 'vector' is not one of \['scalar', 'peel'\]"):
        campaign.plan(config.parse({"problem": "rmsnorm_fwd", "workload": {"panel_twins": {"tail": "vector"}}}))
    with pytest.raises(ConfigError, match=r"workload.rule' must be one of tree, near, auto, got 'forest'"):
        config.parse({"problem": "rmsnorm_fwd", "workload": {"rule": "forest"}})


def test_panel_twins_add_each_genome_with_the_shape_dependent_value_where_feasible():
    base = fwd.space.defaults()
    scalar = Genome.of({**base, "tail": "scalar"})
    peeled = Genome.of({**base, "tail": "peel", "threads": 512})
    subwarp = Genome.of({**base, "tail": "scalar", "threads": 128, "rows_per_cta": 32})   # 4 threads per row
    found = campaign.twins(fwd.space, [scalar, peeled, subwarp], {"tail": "peel"})
    assert found == [Genome.of({**base, "tail": "peel"}), Genome.of({**subwarp.gene_dict, "tail": "peel"})]
    # a twin the rule refuses stays out: cluster > 1 needs rows_per_cta = 1, so a twin over rows_per_cta cannot be
    clustered = Genome.of({**base, "cluster": 4})
    assert campaign.twins(fwd.space, [clustered], {"rows_per_cta": 2}) == []
    assert campaign.twins(fwd.space, [clustered], {"rows_per_cta": 1}) == []   # already that value: no twin


def test_buckets_split_where_the_best_kernel_changes():
    assert bucket(Case((1, 4096), "bfloat16")) == "bfloat16/m<sms/row<=32K/vec"
    assert bucket(Case((131, 4100), "bfloat16")) == "bfloat16/m<sms/row<=32K/tail"
    assert bucket(Case((132, 100), "float32")) == "float32/m<16w/row<=2K/vec"      # 400 bytes: whole vectors
    assert bucket(Case((65536, 262144), "float16")) == "float16/m-large/row>192K/vec"
    near = distance("bfloat16/m<sms/row<=32K/vec", "bfloat16/m<sms/row<=32K/tail")
    assert near < distance("bfloat16/m<sms/row<=32K/vec", "bfloat16/m-large/row>192K/vec") < 10
    assert distance("bfloat16/m<sms/row<=32K/vec", "float16/m<sms/row<=32K/vec") >= 10
    groups = by_bucket([Case((1, 64), "float16"), Case((1, 64), "bfloat16"), Case((9000, 64), "bfloat16")])
    assert list(groups) == ["bfloat16/m<sms/row<=2K/vec", "bfloat16/m-large/row<=2K/vec", "float16/m<sms/row<=2K/vec"]
    merged = by_bucket([Case((1, 64), "float16"), Case((1, 64), "bfloat16"), Case((1, 32), "float32")], False)
    assert merged == {"any/m<sms/row<=2K/vec": [Case((1, 64), "bfloat16"), Case((1, 64), "float16"),
                                                Case((1, 32), "float32")]}


def test_a_run_can_name_its_cases_one_by_one():
    cases = build.cases_of(fwd, "bfloat16:1x4096,float32:5x1024", ("bfloat16", "float32"))
    assert cases == (Case((1, 4096), "bfloat16"), Case((5, 1024), "float32"))
    with pytest.raises(ConfigError, match="dtype 'float16', not one of the run's dtypes"):
        build.cases_of(fwd, "float16:1x4096", ("bfloat16",))


# ---- the learned rule --------------------------------------------------------------------------------------------------

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


def test_fit_prefers_one_leaf_when_a_split_buys_nothing():
    cases = [Case((m, 1024), "float32") for m in (1, 10, 100, 1000, 10000)]
    fitted = learn.fit({c.key: {"a": 1.0, "b": 1.2} for c in cases}, depth=4)
    assert fitted.tree["leaf"] == "a"
    # a genome never measured on a case counts as twice the best there
    fitted = learn.fit({cases[0].key: {"a": 1.0}, cases[1].key: {"b": 1.0}}, depth=0)
    assert fitted.worst == pytest.approx(2.0)


def test_nearest_shapes_vote_with_their_slowdowns_and_keep_tail_rows_apart():
    rng = random.Random()

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
    assert all(re.search(r"training \d\.\d{3}x, worst \d\.\d{3}x; left out \d\.\d{3}x, worst", line) for line in lines)


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


# ---- a campaign on the CPU ------------------------------------------------------------------------------------------------

class CostModel:
    """Stands in for the GPU evaluator: a deterministic time per (genes, case) from a roofline and penalties that
    make different buckets prefer different genomes, and a ledger of every case it was built for."""

    ledger: list[Case] = []

    def __init__(self, cases, space=fwd.space):
        self.cases, self.space = tuple(cases), space
        CostModel.ledger += self.cases
        self.info = EvaluatorInfo("gpu", "cost model (test)", {"gpu": "cost model"})

    @staticmethod
    def time_us(genes, case) -> float:
        m, n = case.shape
        row_bytes = n * ELEM_BYTES[case.dtype]
        t = 3.0 + 2 * m * row_bytes / 3e6
        rows_per_sm = m / 132
        t *= 1 + 0.2 * abs(math.log2(int(genes["threads"])) - (7 if row_bytes <= 2048 else 10))
        t *= 1.0 if (int(genes["cluster"]) > 1) == (rows_per_sm < 1 and row_bytes > 16384) else 1.3
        t *= 1.0 if (genes["load"] == "nc") == (n % 8 == 0) else 1.15
        return t

    def evaluate(self, candidates):
        out = []
        for cand in candidates:
            genes = {**self.space.defaults(), **cand.genome.gene_dict}
            times = {c.key: self.time_us(genes, c) for c in self.cases}
            base = {c.key: 1.2 * self.time_us(self.space.defaults(), c) for c in self.cases}
            out.append(EvalResult(cand.id, Status.OK, geomean_speedup(times, base), times, {}, base,
                                  evaluator="gpu", gpu_s=0.01))
        return out

    def close(self):
        pass


@pytest.fixture
def model_gpu(monkeypatch):
    CostModel.ledger = []
    monkeypatch.setattr(build, "evaluator_kind", lambda cfg: ("gpu", None))
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind: CostModel(run.cases, run.problem.space))
    return CostModel


def test_campaign_searches_buckets_learns_a_rule_and_never_sees_heldout(tmp_path, model_gpu, capsys):
    cfg = config.parse({
        "problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"),
        "tracking": {"store": str(tmp_path / "mlflow.db"), "artifacts": str(tmp_path / "artifacts")},
        "workload": {"dtypes": ["bfloat16", "float32"], "train": 8, "heldout": 12, "seed": 5, "per_bucket": 6,
                     "panel": 6, "rule_depth": 3, "n": [64, 16384], "bucket_by_dtype": False,
                     "panel_twins": {"tail": "peel"}},
        "search": {"population": 4},
        "observers": ["journal", "mlflow"]})
    plan = campaign.plan(cfg)
    folder = campaign.run_campaign(cfg, "camp")
    heldout = set(plan.split.heldout)
    assert model_gpu.ledger and not heldout & set(model_gpu.ledger)
    assert set(model_gpu.ledger) == set(plan.split.train)
    # one run per bucket, each measuring only its bucket's training shapes
    for b, cases in plan.buckets.items():
        run = journal.read(tmp_path / "runs" / f"camp.{campaign.slug(b)}" / journal.NAME)
        measured = {k for _, r in run.pairs() for k in r.times_us}
        assert measured == {c.key for c in cases}
    # later buckets start from their neighbours' winners
    seeds = sorted(folder.glob("seeds-*.json"))
    assert len(seeds) == len(plan.buckets) - 1
    # the rule: loadable by the op's reader, with built kernels, no worse on the training set than one genome
    table = Table(folder / "kernels" / "dispatch.json")
    for dtype in ("bfloat16", "float32"):
        panel = campaign.read_panel(folder / f"panel-{dtype}.jsonl")[1]
        assert set(panel) == {c.key for c in plan.split.train if c.dtype == dtype}
        timed = campaign.read_panel(folder / f"panel-{dtype}.jsonl")[0].values()
        assert not campaign.twins(fwd.space, list(timed), {"tail": "peel"})   # every feasible twin was timed
        assert {g.gene_dict["tail"] for g in timed} == {"scalar", "peel"}
        assert table.data["dtypes"][dtype]["fit"]["slowdown"] <= learn.fit(panel, depth=0).slowdown + 1e-9
    for c in plan.split.train:
        assert table.kernel(c.dtype, c.shape[1], c.shape[0]).cubin()[:4] == b"\x7fELF"
    recorded = json.loads((folder / "workload.json").read_text())
    assert set(recorded["heldout"]) == {c.key for c in heldout}
    assert "the held-out bench needs a GPU" in capsys.readouterr().err
    # MLflow holds the campaign with its sets
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "rmsnorm_fwd"]
    (run,) = client.search_runs([exp.experiment_id], "tags.`kf.kind` = 'workload'")
    assert run.data.params["workload.heldout"] == "24" and run.info.status == "FINISHED"
    assert "workload.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


# ---- the held-out report ------------------------------------------------------------------------------------------------

def _row(dtype, shape, ours, **peers):
    providers = {"factory": {"us": ours, "pct_copy": 50.0}}
    for name, value in peers.items():
        providers[name] = value if isinstance(value, dict) else {"us": value}
    return {"case": f"{dtype}:{shape[0]}x{shape[1]}", "dtype": dtype, "shape": list(shape), "providers": providers}


def test_heldout_lines_compare_with_the_best_correct_peer():
    from kernel_factory.evo.tools import heldout
    result = {"format": "kernel-factory-bench/1", "rows": [
        _row("bfloat16", (1, 4096), 10.0, int21=8.0, liger=12.0),                      # 0.80 against int21
        _row("bfloat16", (4096, 4100), 20.0, int21={"us": 10.0, "note": "incorrect: 3% off"}, liger=25.0),
        _row("bfloat16", (7, 100), 5.0, int21={"error": "needs N % 8 == 0"}, torch_eager=6.0),
        _row("float32", (64, 64), 4.0, int21=4.4)]}
    lines, md = heldout.summarize(result, "rmsnorm_fwd")
    ratios = [0.8, 25 / 20, 6 / 5]
    geo = math.exp(sum(map(math.log, ratios)) / 3)
    # a result from before benches recorded their peers: what ran is read from the rows, and the declared peers
    # that did not run on a dtype's rows are named in its line
    assert lines == [f"held-out fwd bf16: geomean {geo:.2f}x best peer over 3 shapes (without QuACK, torch.compile), "
                     "worst 0.80x at 1x4096",
                     "held-out fwd fp32: geomean 1.10x best peer over 1 shapes (without QuACK, Liger, torch eager, "
                     "torch.compile), worst 1.10x at 64x64"]
    assert "int21 left out: incorrect: 3% off" in md and "int21 failed: needs N % 8 == 0" in md


def test_heldout_times_the_shipped_op_beside_the_table_and_says_how_they_compare(tmp_path, monkeypatch):
    from kernel_factory.evo.tools import bench, heldout
    asked = []

    def fake_run(problem, subject, shapes, dtypes, baselines, *args, **kwargs):
        asked.append((subject, baselines))
        return {"format": "kernel-factory-bench/1", "rows": [], "baselines": baselines}
    monkeypatch.setattr(bench, "run", fake_run)
    cases = [Case.parse("bfloat16:7x300"), Case.parse("float32:9x500")]
    heldout.bench_heldout("rmsnorm_fwd", tmp_path / "dispatch.json", cases, tmp_path / "b.json")
    assert len(asked) == 2 and all(b[-1] == "factory_op" and "quack" in b and "quack_tuned" not in b
                                   for _, b in asked)
    m = random.uniform(1.5, 3.0)
    result = {"format": "kernel-factory-bench/1", "rows": [
        _row("bfloat16", (1, 4096), 10.0, int21=8.0, factory_op=10.0 * m),
        _row("bfloat16", (3, 5000), 20.0, int21=30.0, factory_op=10.0),
        _row("float16", (3, 5000), 20.0, int21=30.0)]}
    lines, md = heldout.summarize(result, "rmsnorm_fwd")
    # the op is never the best peer; its comparison is a line of its own, only where it was timed
    assert lines[0].startswith(f"held-out fwd bf16: geomean {math.sqrt(0.8 * 1.5):.2f}x best peer over 2 shapes")
    assert f"- `against the shipped op fwd bf16: geomean {math.sqrt(m / 2):.2f}x over 2 shapes, worst 0.50x at 3x5000`" in md
    assert "against the shipped op fwd fp16" not in md


def test_a_heldout_bench_cut_short_says_so_in_its_lines_and_its_report():
    from kernel_factory.evo.tools import heldout
    k = random.randint(2, 40)
    part = {"format": "kernel-factory-bench/1", "partial": f"{k} of 48 cases",
            "rows": [_row("float16", (3, 5000), 20.0, int21=30.0)]}
    lines, md = heldout.summarize({"format": "kernel-factory-bench-suite/1", "partial": "0 of 1 parts in full",
                                   "parts": [part]}, "rmsnorm_bwd")
    assert f"cut short: {k} of 48 cases benched" in lines[0] and "**Partial**: 0 of 1 parts in full" in md


def test_heldout_command_rerenders_a_recorded_bench(tmp_path, capsys):
    from kernel_factory.evo.tools import cli
    (tmp_path / "workload.json").write_text(json.dumps({"config": {"problem": "rmsnorm_fwd"}, "heldout": []}))
    bench_json = tmp_path / "b.json"
    bench_json.write_text(json.dumps({"format": "kernel-factory-bench/1",
                                      "rows": [_row("float16", (3, 300), 2.0, int21=3.0)]}))
    assert cli.main(["heldout", str(tmp_path), "--from", str(bench_json)]) == 0
    assert "held-out fwd fp16: geomean 1.50x best peer over 1 shapes" in capsys.readouterr().out
    assert cli.main(["heldout", str(tmp_path / "nowhere")]) == cli.EXIT_BAD_INPUT
    assert "not a workload campaign folder" in capsys.readouterr().err


def test_a_second_pass_relearns_from_the_searched_winners_a_table_and_more_shapes(tmp_path, model_gpu):
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4, "panel": 4,
                         "n": [64, 8192], "validate": False},
            "search": {"population": 4}}
    first = campaign.run_campaign(config.parse(base), "first")
    searched = len(model_gpu.ledger)
    shipped = Path(__file__).resolve().parents[1] / "kernels" / "ops" / "rmsnorm_fwd.json"
    base["workload"].update(searched_from=str(first), panel_from=str(shipped), extra_train="benchmark")
    cfg = config.parse(base)
    second = campaign.run_campaign(cfg, "second")
    assert not list((tmp_path / "runs").glob("second.*"))           # no bucket search ran again
    new_cases = set(model_gpu.ledger[searched:])
    plan = campaign.plan(cfg)
    assert new_cases == {c for c in plan.split.train} | {Case(s, "float16") for s in fwd.shape_sets["benchmark"]}
    assert not new_cases & set(plan.split.heldout)
    genomes = {json.loads(line)["genome"]["genes"]["threads"] for line in
               (second / "panel-float16.jsonl").read_text().splitlines()}
    table = Table(shipped, runnable=False)
    assert len((second / "panel-float16.jsonl").read_text().splitlines()) > 4   # the table's genomes joined
    assert {int(g["genes"]["threads"]) for g in table.data["genomes"].values()} & genomes
    base["workload"]["n"] = [64, 4096]
    with pytest.raises(ConfigError, match="searched other buckets"):
        campaign.run_campaign(config.parse(base), "third")


def test_a_rule_learned_again_from_an_earlier_campaigns_panels_times_nothing(tmp_path, model_gpu):
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16", "float32"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4,
                         "panel": 4, "n": [64, 8192], "validate": False}, "search": {"population": 4}}
    first = campaign.run_campaign(config.parse(base), "first")
    timed = len(model_gpu.ledger)
    with tarfile.open(first / "panels.tar.xz", "w:xz") as packed:   # packed, as a committed campaign holds them
        packed.add(first / "panel-float16.jsonl", "panel-float16.jsonl")
    (first / "panel-float16.jsonl").unlink()
    base["workload"].update(panels_from=str(first), rule="near")
    again = campaign.run_campaign(config.parse(base), "again")
    assert len(model_gpu.ledger) == timed and not list((tmp_path / "runs").glob("again.*"))
    table = Table(again / "kernels" / "dispatch.json")
    for dtype in ("float16", "float32"):
        assert (again / f"panel-{dtype}.jsonl").is_file() and "near" in table.data["dtypes"][dtype]["rule"]
        gid, why = table.choose(dtype, 4096, 77)
        assert gid in table.data["genomes"] and table.kernel(dtype, 4096, 77).cubin()[:4] == b"\x7fELF"
    for change, match in (({"seed": 10}, "drew other held-out shapes"),
                          ({"searched_from": str(first)}, "exclude each other"),
                          ({"panels_from": str(tmp_path)}, "is not a campaign folder")):
        with pytest.raises(ConfigError, match=match):
            campaign.run_campaign(config.parse({**base, "workload": {**base["workload"], **change}}), "bad")


def test_each_bucket_search_starts_from_what_the_table_picks_for_its_shapes(tmp_path, model_gpu):
    shipped = Path(__file__).resolve().parents[1] / "kernels" / "ops" / "rmsnorm_fwd.json"
    cfg = config.parse({"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"),
                        "observers": ["journal"], "search": {"population": 6},
                        "workload": {"dtypes": ["bfloat16"], "train": 6, "heldout": 4, "seed": 9, "per_bucket": 6,
                                     "panel": 4, "validate": False, "panel_from": str(shipped)}})
    plan = campaign.plan(cfg)
    campaign.run_campaign(cfg, "picked")
    table = Table(shipped, runnable=False)
    for b, cases in plan.buckets.items():
        picked = list(dict.fromkeys(table.choose(c.dtype, c.shape[1], c.shape[0])[0] for c in cases))
        run = journal.read(tmp_path / "runs" / f"picked.{campaign.slug(b)}" / journal.NAME)
        first = [c.genome.gene_dict for c, _ in run.pairs() if c.operator == "seed"][:len(picked)]
        # the same genes (a table from before a gene was added holds that gene at its default in the space)
        assert len(first) == len(picked)
        for genes, gid in zip(first, picked):
            assert table.data["genomes"][gid]["genes"].items() <= genes.items()


def test_the_backward_runs_the_same_campaign_and_its_table_dispatches_by_m_and_n(tmp_path, model_gpu):
    """The backward problem on the workload machinery: its own workload drawn and split, every bucket searched in the
    backward's gene space, a rule learned per dtype, the backward's kernels built, and the op's table reader choosing
    by M and N; no held-out shape is ever timed."""
    from kernel_factory.problems.rmsnorm_bwd import problem as bwd
    cfg = config.parse({
        "problem": "rmsnorm_bwd", "seed": 4, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
        "workload": {"dtypes": ["bfloat16"], "train": 8, "heldout": 10, "seed": 11, "per_bucket": 4, "panel": 4,
                     "rule_depth": 2, "rule": "auto", "n": [64, 16384], "validate": False},
        "search": {"population": 4}})
    plan = campaign.plan(cfg)
    assert plan.workload.dtypes == ("bfloat16",) and plan.workload == narrow(bwd.workload, dtypes=["bfloat16"],
                                                                              n=[64, 16384])
    folder = campaign.run_campaign(cfg, "bwd")
    assert set(model_gpu.ledger) == set(plan.split.train) and not set(plan.split.heldout) & set(model_gpu.ledger)
    for b in plan.buckets:   # each bucket searched the backward's genes
        run = journal.read(tmp_path / "runs" / f"bwd.{campaign.slug(b)}" / journal.NAME)
        assert run.config["problem"] == "rmsnorm_bwd"
        assert all(set(c.genome.gene_dict) <= {g.name for g in bwd.space.genes} for c, _ in run.pairs())
    table = Table(folder / "kernels" / "dispatch.json")
    assert table.problem == "rmsnorm_bwd" and "rule" in table.data["dtypes"]["bfloat16"]
    fit = table.data["dtypes"]["bfloat16"]["fit"]   # rule: auto took the learner better on the cases left out
    assert fit["rule"] == min(fit["left_out_of"], key=fit["left_out_of"].get) and set(fit["left_out_of"]) == {
        "tree", "near"} and fit["left_out"]["slowdown"] == min(fit["left_out_of"].values())
    for c in [*plan.split.train, *plan.split.heldout]:   # any shape gets a backward kernel the rule names
        m, n = c.shape
        gid, why = table.choose("bfloat16", n, m)
        assert why.startswith("rule leaf") and gid in table.data["genomes"]
        assert table.kernel("bfloat16", n, m).cubin()[:4] == b"\x7fELF"
    # `kernel-factory export CAMPAIGN --problem rmsnorm_bwd --build` gives the op's backward this rule
    from kernel_factory.evo.tools import export
    out, _ = export.export("rmsnorm_bwd", [str(folder)], tmp_path / "ops" / "rmsnorm_bwd.json", build=True)
    op_table = Table(out)
    assert all(op_table.choose("bfloat16", c.shape[1], c.shape[0]) == table.choose("bfloat16", c.shape[1], c.shape[0])
               for c in plan.split.heldout)
    with pytest.raises(export.ExportError, match="not 'rmsnorm_fwd'"):
        export.export("rmsnorm_fwd", [str(folder)], tmp_path / "ops" / "fwd.json")
