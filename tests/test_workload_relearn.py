"""A finished workload campaign learned again on the CPU (the cost model of workload_model.py stands in for the GPU):
from its bucket searches' winners, with an earlier campaign's panel winners, from its panels alone, with more training
shapes, and after the space gained a gene. A campaign's first pass is in test_workload.py."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from kernel_factory.evo import config
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.tools import workload as campaign
from kernel_factory.evo.types import Case, Genome
from kernel_factory.kernels.table import Table
from kernel_factory.problems.rmsnorm_fwd import problem as fwd
from workload_model import model_gpu  # noqa: F401  (the fixture)


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
