"""Workloads, not benchmark rows: the seeded training / held-out draws, the buckets, and a whole campaign on the CPU
with a stand-in for the GPU (a deterministic cost model of genes and shape) that records every case it was asked to
time, so that "no search sees a held-out shape" is checked on what was actually evaluated, not on the plan. The
learned rules are in test_dispatch_rules.py, the held-out report in test_heldout_report.py, campaigns learned again in
test_workload_relearn.py."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from kernel_factory.evo import build, config, journal
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.tools import learn, workload as campaign
from kernel_factory.evo.types import Case, Genome
from kernel_factory.evo.workload import (ELEM_BYTES, Workload, bucket, by_bucket, distance, draw, narrow, split)
from kernel_factory.kernels.table import Table
from kernel_factory.problems.rmsnorm_fwd import problem as fwd
from workload_model import model_gpu  # noqa: F401  (the fixture)


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


# ---- a campaign on the CPU (workload_model.py's cost model stands in for the GPU) ------------------------------------

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
