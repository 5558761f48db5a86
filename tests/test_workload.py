"""Workloads, not benchmark rows: the seeded training / held-out draws, the buckets, and a whole campaign on the CPU
with a stand-in for the GPU (a deterministic cost model of genes and shape) that records every case it was asked to
time, so that "no search sees a held-out shape" is checked on what was actually evaluated, not on the plan. The
learned rules are in test_dispatch_rules.py, the held-out report in test_heldout_report.py."""
from __future__ import annotations

import json
import math
import random
import tarfile
from pathlib import Path

import pytest

from kernel_factory.evo import build, config, journal
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.protocols import EvaluatorInfo
from kernel_factory.evo.tools import learn, workload as campaign
from kernel_factory.evo.types import Case, EvalResult, Genome, Status, geomean_speedup
from kernel_factory.evo.workload import (ELEM_BYTES, Workload, bucket, by_bucket, distance, draw, narrow, split)
from kernel_factory.kernels.table import Table
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
    twins = {"problem": "rmsnorm_fwd", "workload": {"panel_twins": {"w_ahead": ["l2", "vram"]}}}
    with pytest.raises(ConfigError, match=r"workload.panel_twins.w_ahead': 'vram' is not one of \['none', 'l2', 'r"):
        campaign.plan(config.parse(twins))
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


# ---- a campaign on the CPU ------------------------------------------------------------------------------------------------

class CostModel:
    """Stands in for the GPU evaluator: a deterministic time per (genes, case) from a roofline and penalties that
    make different buckets prefer different genomes, a ledger of every case it was built for and the genomes it
    evaluated."""

    ledger: list[Case] = []
    evaluated: list[Genome] = []

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
            CostModel.evaluated.append(cand.genome)
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
    CostModel.ledger, CostModel.evaluated = [], []
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


def test_with_panel_all_dtypes_each_panel_times_what_the_other_dtypes_found(tmp_path, model_gpu):
    """Genes are dtype-free: the table's genomes of every dtype, and with buckets per dtype the other dtypes' bucket
    winners, join each dtype's panel; without the key, a panel holds its own dtype's only."""
    shipped = Path(__file__).resolve().parents[1] / "kernels" / "ops" / "rmsnorm_fwd.json"
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16", "float32"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4,
                         "panel": 4, "n": [64, 8192], "validate": False, "panel_from": str(shipped)},
            "search": {"population": 4}}
    table = {dt: set(campaign.table_seeds(str(shipped), fwd, fwd.space, dtype=dt)) for dt in ("float16", "float32")}
    assert table["float16"] - table["float32"] and table["float32"] - table["float16"]
    alone = campaign.run_campaign(config.parse(base), "alone")
    base["workload"]["panel_all_dtypes"] = True
    shared = campaign.run_campaign(config.parse(base), "shared")
    best = {}   # each dtype's buckets' best genomes
    for b in campaign.plan(config.parse(base)).buckets:
        path = tmp_path / "runs" / f"shared.{campaign.slug(b)}" / journal.NAME
        best.setdefault(b.split("/")[0], set()).update(campaign.winners(path, 1))
    for dtype, other in (("float16", "float32"), ("float32", "float16")):
        mine = set(campaign.read_panel(alone / f"panel-{dtype}.jsonl")[0].values())
        both = set(campaign.read_panel(shared / f"panel-{dtype}.jsonl")[0].values())
        assert table[dtype] <= mine and not (table[other] - table[dtype]) & mine
        assert table[dtype] | table[other] | best[other] <= both and mine <= both


def test_an_earlier_campaigns_panel_winners_join_the_panels(tmp_path, model_gpu):
    """workload.panel_winners_from: the genomes fastest on some training shape of an earlier campaign's panels (read
    packed, as committed) are timed again in this campaign's panels; a campaign of another held-out draw is refused."""
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16", "float32"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4,
                         "panel": 2, "n": [64, 8192], "validate": False}, "search": {"population": 4}}
    first = campaign.run_campaign(config.parse(base), "first")
    with tarfile.open(first / "panels.tar.xz", "w:xz") as packed:
        for dtype in ("float16", "float32"):
            packed.add(first / f"panel-{dtype}.jsonl", f"panel-{dtype}.jsonl")
            (first / f"panel-{dtype}.jsonl").unlink()
            (first / f"panel-{dtype}.jsonl").with_suffix(".txt").write_bytes(b"")   # not a panel: ignored
    won = {}
    for dtype in ("float16", "float32"):
        with tarfile.open(first / "panels.tar.xz") as packed:
            genomes, times = campaign.read_panel(packed.extractfile(f"panel-{dtype}.jsonl").read())
        won[dtype] = {genomes[min(row, key=row.__getitem__)] for row in times.values()}
    base["seed"] = 4   # other searches, so other bucket winners
    base["workload"].update(panel_winners_from=str(first))
    again = campaign.run_campaign(config.parse(base), "again")
    for dtype in ("float16", "float32"):
        assert won[dtype] <= set(campaign.read_panel(again / f"panel-{dtype}.jsonl")[0].values())
    base["workload"]["seed"] = 10
    with pytest.raises(ConfigError, match="panel_winners_from.*drew other held-out shapes"):
        campaign.run_campaign(config.parse(base), "other")


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


def test_more_training_shapes_are_timed_only_where_an_earlier_panel_lacks_them(tmp_path, model_gpu):
    """workload.train_more: the training stream drawn on, for the panels and the rule only (no bucket search, never a
    held-out shape); with panel_times_from an earlier panel's times stay, and only the shapes it lacks are timed."""
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4, "panel": 4,
                         "n": [64, 8192], "validate": False}, "search": {"population": 4}}
    first, before = campaign.run_campaign(config.parse(base), "first"), campaign.plan(config.parse(base))
    base["workload"].update(train_more=4, searched_from=str(first), panel_times_from=str(first))
    plan, timed = campaign.plan(config.parse(base)), len(model_gpu.ledger)
    second = campaign.run_campaign(config.parse(base), "second")
    assert plan.split == before.split and len(plan.more) == 4
    assert not set(plan.more) & {*plan.split.train, *plan.split.heldout}
    assert set(model_gpu.ledger[timed:]) == set(plan.more)   # the panel's genomes on the new shapes only
    old, new = (campaign.read_panel(f / "panel-float16.jsonl")[1] for f in (first, second))
    assert set(new) == {c.key for c in (*plan.split.train, *plan.more)}
    assert all(new[key] == row for key, row in old.items())
    assert json.loads((second / "workload.json").read_text())["train_more"] == [c.key for c in plan.more]
    base["workload"]["train_more"] = -1
    with pytest.raises(ConfigError, match="workload.train_more': -1"):
        campaign.plan(config.parse(base))


def test_a_campaign_learned_again_with_a_new_gene_times_only_the_twins_it_adds(tmp_path, model_gpu):
    """workload.search false: no bucket search; the panels hold an earlier campaign's winners and their twins over
    a gene added since (w_ahead), and the earlier panel's times stay under the genomes' ids today, so that only the
    twins are timed."""
    base = {"problem": "rmsnorm_fwd", "seed": 3, "out_dir": str(tmp_path / "runs"), "observers": ["journal"],
            "workload": {"dtypes": ["float16"], "train": 6, "heldout": 6, "seed": 9, "per_bucket": 4, "panel": 4,
                         "n": [64, 8192], "validate": False}, "search": {"population": 4}}
    first = campaign.run_campaign(config.parse(base), "first")
    path = first / "panel-float16.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    for e in entries:   # as committed before the gene existed
        e["genome"]["genes"].pop("w_ahead")
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    old_genomes, old_times = campaign.read_panel(path)
    base["workload"].update(search=False, panel_winners_from=str(first), panel_times_from=str(first),
                            panel_twins={"w_ahead": ["l2", "regs"]})
    before = len(model_gpu.evaluated)
    second = campaign.run_campaign(config.parse(base), "second")
    assert not list((tmp_path / "runs").glob("second.*")), "no bucket search may run"
    genomes, times = campaign.read_panel(second / "panel-float16.jsonl")
    fresh = model_gpu.evaluated[before:]
    assert fresh and all(g.gene_dict["w_ahead"] in ("l2", "regs") for g in fresh)
    assert set(fresh) == {g for g in genomes.values() if g.gene_dict["w_ahead"] != "none"}
    today = {gid: Genome.of({**g.gene_dict, "w_ahead": "none"}).id for gid, g in old_genomes.items()}
    kept = [gid for gid, now in today.items() if now in genomes]
    assert kept
    for gid in kept:   # each earlier winner kept its times, under today's id
        assert all(times[key][today[gid]] == row[gid] for key, row in old_times.items()), gid
    assert {Genome.of({**g.gene_dict, "w_ahead": "none"}).id for g in fresh} <= {today[gid] for gid in kept}
    assert Table(second / "kernels" / "dispatch.json").choose("float16", 4096, 77)
    for change, match in (({"searched_from": str(first)}, "excludes 'workload.searched_from'"),
                          ({"panel_winners_from": None, "panel_times_from": None}, "leaves the panels empty")):
        with pytest.raises(ConfigError, match=match):
            campaign.run_campaign(config.parse({**base, "workload": {**base["workload"], **change}}), "bad")
