"""Grafting a rule learned for a region of shapes (few rows) into the op's dispatch table, on the CPU: inside the
region the grafted rule decides, outside it every choice stays what it was, leaves stay uniquely numbered, bad grafts
name what is wrong, and `kernel-factory graft` builds the kernels it adds so that the op can run them."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from kernel_factory.evo.tools import cli, dispatch
from kernel_factory.evo.types import Genome
from kernel_factory.kernels import dispatch_rule
from kernel_factory.kernels.table import Table
from kernel_factory.problems.rmsnorm_fwd import problem

SHIPPED = Path(__file__).resolve().parents[1] / "kernels/ops/rmsnorm_fwd.json"


def _genes(**changes) -> dict:
    return {**problem.space.defaults(), **changes}


def _graft(dtypes=("bfloat16", "float32")) -> dict:
    """A small-M rule per dtype: 16-CTA clusters for wide rows, 128 threads for the rest."""
    wide, narrow = _genes(cluster=16, tail="peel", w_ahead="regs"), _genes(threads=128, keep_x=False, unroll=1)
    ids = {Genome.of(g).id: g for g in (wide, narrow)}
    tree = {"feature": "log2_n", "le": 13.5, "then": {"leaf": Genome.of(narrow).id, "id": 1},
            "else": {"leaf": Genome.of(wide).id, "id": 2}}
    return {"region": {"feature": "log2_m", "le": 6.0}, "rules": {d: {"tree": tree} for d in dtypes},
            "genomes": ids, "source": "a test"}


def test_a_graft_decides_in_its_region_and_leaves_every_other_choice_as_it_was():
    table = dispatch.load(SHIPPED)
    before = json.dumps(table, sort_keys=True)
    grafted = dispatch.graft(table, _graft(), ["bfloat16"])
    assert json.dumps(table, sort_keys=True) == before   # the caller's table is not touched
    rng = random.Random(7)
    wide, narrow = (Genome.of(_genes(cluster=16, tail="peel", w_ahead="regs")).id,
                    Genome.of(_genes(threads=128, keep_x=False, unroll=1)).id)
    inside = outside = 0
    for _ in range(600):
        dtype = rng.choice(problem.dtypes)
        m, n = rng.choice([rng.randint(1, 64), rng.randint(65, 70000)]), rng.randint(1, 300000)
        new, old = dispatch.lookup(grafted, dtype, n, m), dispatch.lookup(table, dtype, n, m)
        if dtype == "bfloat16" and m <= 64:
            inside += 1
            assert new[0].id == (narrow if n < 2 ** 13.5 else wide)
            assert new[0].gene_dict == Genome.of(_genes(**({"threads": 128, "keep_x": False, "unroll": 1}
                                                         if n < 2 ** 13.5 else
                                                         {"cluster": 16, "tail": "peel", "w_ahead": "regs"}))).gene_dict
        else:
            outside += 1
            assert new == old, (dtype, m, n)
    assert inside > 50 and outside > 300
    entry = grafted["dtypes"]["bfloat16"]
    ids = [n["id"] for n in _nodes(entry["rule"]) if "leaf" in n or "near" in n]
    assert len(ids) == len(set(ids))
    assert entry["grafted"][-1] == {"region": {"feature": "log2_m", "le": 6.0}, "source": "a test"}
    assert entry["grafted"][:-1] == table["dtypes"]["bfloat16"].get("grafted", [])
    assert dispatch_rule.check(entry["rule"], "bfloat16") == []
    assert grafted["dtypes"]["float16"] == table["dtypes"]["float16"]


def _nodes(node: dict) -> list[dict]:
    return [node] + [x for b in ("then", "else") if b in node for x in _nodes(node[b])]


@pytest.mark.parametrize("change, message", [
    (lambda g: g.update(region={"feature": "colour", "le": 6}), "'region' must be"),
    (lambda g: g["genomes"].popitem(), "whose genes it does not give"),
    (lambda g: g["genomes"].update({k: _genes(threads=512) for k in list(g["genomes"])[:1]}), "are those of genome"),
    (lambda g: g["rules"]["bfloat16"]["tree"].update(feature="colour"), "colour"),
    (lambda g: g["rules"].pop("bfloat16"), "no rule for bfloat16"),
])
def test_a_bad_graft_names_what_is_wrong(change, message):
    g = _graft()
    change(g)
    with pytest.raises(dispatch.TableError, match=message):
        dispatch.graft(dispatch.load(SHIPPED), g, ["bfloat16"])


def test_a_table_without_a_rule_cannot_take_a_graft():
    table = {"format": dispatch.FORMAT, "genomes": {}, "dtypes": {"bfloat16": {"general": {"genome": "x"}}}}
    with pytest.raises(dispatch.TableError, match="no learned rule for bfloat16"):
        dispatch.graft(table, _graft(), ["bfloat16"])


def test_the_graft_command_builds_the_kernels_the_op_runs(tmp_path, capsys):
    """One dtype of the shipped table (fewer compiles), grafted and built: the op's reader loads it runnable, each
    cubin on disk is the one its record hashes, and at M = 1 the op runs the grafted genome."""
    small = dispatch.load(SHIPPED)
    small["dtypes"] = {"float32": small["dtypes"]["float32"]}
    keep = {gid for gid, _ in dispatch.used(small)}
    small["genomes"] = {k: v for k, v in small["genomes"].items() if k in keep}
    small.pop("kernels")
    (tmp_path / "t.json").write_text(json.dumps(small))
    (tmp_path / "g.json").write_text(json.dumps(_graft(("float32",))))
    assert cli.main(["graft", str(tmp_path / "g.json"), "--problem", "rmsnorm_fwd", "--table",
                     str(tmp_path / "t.json"), "--out", str(tmp_path / "op/rmsnorm_fwd.json")]) == 0
    op = Table(tmp_path / "op/rmsnorm_fwd.json")
    wide = Genome.of(_genes(cluster=16, tail="peel", w_ahead="regs")).id
    assert op.choose("float32", 65536, 1)[0] == wide
    assert op.choose("float32", 65536, 4096)[0] == dispatch.lookup(small, "float32", 65536, 4096)[0].id
    data = json.loads((tmp_path / "op/rmsnorm_fwd.json").read_text())
    for key, record in data["kernels"].items():
        assert hashlib.sha256((tmp_path / "op" / record["cubin"]).read_bytes()).hexdigest() == record["sha256"], key
    assert f"{wide}:float32" in data["kernels"] and data["kernels"][f"{wide}:float32"]["recipe"]["steps"][0][
        "cluster"] == 16
    assert cli.main(["graft", str(tmp_path / "missing.json"), "--problem", "rmsnorm_fwd"]) == 2
    assert "cannot read graft" in capsys.readouterr().err
    (tmp_path / "list.json").write_text("[1, 2]")
    assert cli.main(["graft", str(tmp_path / "list.json"), "--problem", "rmsnorm_fwd"]) == 2
    err = capsys.readouterr().err
    assert "must be a JSON object" in err and "Traceback" not in err


def test_widen_adds_the_panel_winners_the_table_does_not_run_as_tuning_candidates(tmp_path, capsys):
    table = json.loads(SHIPPED.read_text())
    entry = table["dtypes"]["float16"]
    named = set(table_chosen := dispatch.op_table.chosen_genomes(entry))
    rng = random.Random()
    fresh = [Genome.of(_genes(threads=t, unroll=u)) for t in (128, 512) for u in (1, 4)]
    fresh = [g for g in fresh if g.id not in named]
    old = Genome.from_json(table["genomes"][table_chosen[0]])
    cases = [f"float16:{m}x{n}" for m in (3, 700, 9000) for n in (96, 4100, 20000)]
    winner_of = {c: rng.choice([*fresh, old]) for c in cases}
    lines = [json.dumps({"genome": g.to_json(), "result": {"status": "ok", "times_us": {
        c: (5.0 if winner_of[c].id == g.id else rng.uniform(6, 9)) for c in cases}}}) for g in [*fresh, old]]
    rule_before, before = json.dumps(entry["rule"], sort_keys=True), list(entry.get("candidates", []))
    added = dispatch.widen(table, {"float16": "\n".join(lines).encode(), "float64": b""})
    want = [g.id for g in fresh if any(w.id == g.id for w in winner_of.values())]
    assert added == {"float16": len(want)} and entry["candidates"][:len(before)] == before
    assert sorted(entry["candidates"][len(before):]) == sorted(want)
    assert all(table["genomes"][g]["genes"] == next(f for f in fresh if f.id == g).to_json()["genes"] for g in want)
    assert json.dumps(entry["rule"], sort_keys=True) == rule_before          # the rule picks as before
    assert dispatch.widen(table, {"float16": "\n".join(lines).encode()}) == {"float16": 0}   # nothing twice
    assert set(dispatch.op_table.chosen_genomes(entry)) == named | set(want)


def test_widen_reads_a_committed_campaigns_packed_panels_and_refuses_a_folder_without(tmp_path, capsys):
    from kernel_factory.evo.tools.workload_panels import folder_panels
    panels = folder_panels(Path(__file__).resolve().parents[1] / "docs/results/workload/h200-bwd-workload-2")
    assert sorted(panels) == ["bfloat16", "float16", "float32"] and all(p.startswith(b'{"genome"')
                                                                         for p in panels.values())
    assert cli.main(["widen", str(tmp_path), "--problem", "rmsnorm_bwd"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "panels.tar.xz" in err and "Traceback" not in err


def _study(monkeypatch):
    """tests/gpu/grid_study.py, whose panels `widen --where` reads (its grids, shapes and panel writer need no GPU)."""
    import importlib.util
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "gpu"))
    spec = importlib.util.spec_from_file_location("grid_study", Path(__file__).parent / "gpu/grid_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_widen_where_bounds_a_studys_winners_to_the_shapes_it_measured(tmp_path, capsys, monkeypatch):
    study = _study(monkeypatch)
    genomes = study.grid(problem, "small")
    rng = random.Random()
    cases = [f"{d}:{m}x{n}" for d in ("bfloat16", "float32") for m, n in ((3, 96), (700, 2000), (64, 8000))]
    rows = [{"case": c, "grid_us": {g: rng.uniform(2, 9) for g in rng.sample(sorted(genomes), 20)}} for c in cases]
    wrong = min(rows[0]["grid_us"], key=rows[0]["grid_us"].get)    # the fastest on one shape, wrong on another
    rows[1]["failed"] = {wrong: "incorrect: y: 3 of 2000 values off"}
    study.write_panels(problem, genomes, rows, tmp_path / "panels")
    assert sorted(p.name for p in (tmp_path / "panels").iterdir()) == ["panel-bfloat16.jsonl", "panel-float32.jsonl"]
    table = json.loads(SHIPPED.read_text())
    before = {d: list(e.get("candidates", [])) for d, e in table["dtypes"].items()}
    region = dispatch.parse_region("log2_n<=13")
    from kernel_factory.evo.tools.workload_panels import folder_panels
    added = dispatch.widen(table, folder_panels(tmp_path / "panels"), region)
    for dtype in ("bfloat16", "float32"):
        mine = [r for r in rows if r["case"].startswith(dtype)]
        bad = {g for r in mine for g in r.get("failed", {})}
        winners = {min((g for g in r["grid_us"] if g not in bad), key=r["grid_us"].get) for r in mine}
        new = table["dtypes"][dtype]["candidates"][len(before[dtype]):]
        assert added[dtype] == len(new) and all(c["where"] == region for c in new)
        assert {c["genome"] for c in new} == winners - set(dispatch.op_table.chosen_genomes(
            {**table["dtypes"][dtype], "candidates": before[dtype]}))
        assert all(table["genomes"][c["genome"]]["genes"] == genomes[c["genome"]] for c in new)
    assert wrong not in {c["genome"] for c in table["dtypes"]["bfloat16"]["candidates"][len(before["bfloat16"]):]}
    assert table["dtypes"]["float16"].get("candidates", []) == before["float16"]   # no panel: untouched
    with pytest.raises(dispatch.TableError, match="log2_q"):
        dispatch.widen(table, {}, {"feature": "log2_q", "le": 3})
    assert cli.main(["widen", str(tmp_path / "panels"), "--problem", "rmsnorm_fwd", "--where", "n<=256",
                     "--out", str(tmp_path / "t.json")]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "'n<=256'" in err and "log2_n" in err and "Traceback" not in err and not (tmp_path / "t.json").exists()


def test_the_studys_grids_are_feasible_and_their_shapes_held_out_of_every_campaign(monkeypatch):
    study = _study(monkeypatch)
    campaigns = {k for path in study.CAMPAIGNS for part in ("train", "heldout")
                 for k in json.loads(path.read_text()).get(part, [])}
    for (name, grid), (_, region, where) in study.GRIDS.items():
        plugin = study.problem_of(name)
        genomes = study.grid(plugin, grid)
        assert len(genomes) >= 40 and all(plugin.space.why_infeasible(g) is None for g in genomes.values())
        cases = study.shapes(plugin, grid, 6)
        assert len(cases) == 6 * len(plugin.dtypes) and not {c.key for c in cases} & campaigns
        assert all(region.get("m", (1, 1 << 30))[0] <= c.shape[0] <= region.get("m", (1, 1 << 30))[1]
                   and region.get("n", (1, 1 << 30))[0] <= c.shape[1] <= region.get("n", (1, 1 << 30))[1]
                   for c in cases)
        assert dispatch.parse_region(where)["feature"] in ("log2_n", "log2_m")


def test_twin_swaps_every_feasible_genome_for_its_twin_and_keeps_the_rest(capsys):
    from kernel_factory.problems.rmsnorm_bwd import problem as bwd
    path = SHIPPED.parent / "rmsnorm_bwd.json"
    table, before = dispatch.load(path), dispatch.load(path)
    renamed = dispatch.twin(table, bwd, {"tail": "peel"})
    for dtype, entry in before["dtypes"].items():
        old, new = dispatch.op_table.chosen_genomes(entry), dispatch.op_table.chosen_genomes(table["dtypes"][dtype])
        assert new == [renamed.get(g, g) for g in old]   # the same choices, in the same places, under twin ids
        for gid in set(old):
            genes = {**bwd.space.defaults(), **before["genomes"][gid]["genes"]}
            if gid in renamed:   # the twin: the same genes but tail=peel, feasible
                assert table["genomes"][renamed[gid]]["genes"] == {**genes, "tail": "peel"}
                assert gid not in table["genomes"]
            else:                # kept: peeled already (the shipped table is a twin), or its twin breaks the problem's
                # rule (rows_per_cta > 1, registers)
                assert genes["tail"] == "peel" or bwd.space.why_infeasible({**genes, "tail": "peel"})
                assert gid in table["genomes"]
    assert renamed and len(renamed) < len(before["genomes"])
    costs = json.dumps(table["dtypes"]["bfloat16"]["rule"])   # the rule's costs follow the ids
    assert not any(f'"{gid}"' in costs for gid in renamed)
    assert table["twinned"][-1] == {"changes": {"tail": "peel"}, "genomes": len(renamed)}
    assert cli.main(["twin", "--problem", "rmsnorm_bwd", "--set", "tail=always", "--table", str(path)]) \
        == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "tail=always" in err and "'none', 'peel'" in err and "Traceback" not in err
    with pytest.raises(dispatch.TableError, match="is not a gene value of rmsnorm_bwd"):
        dispatch.twin(table, bwd, {"tails": "peel"})


def test_twin_reads_gene_values_as_written_or_as_yaml():
    """`--set narrow=true` means narrow=True, as `-o` reads a config value; an int gene takes its number and a bool
    never stands for 1; a value that is none of the choices names the choices."""
    from kernel_factory.problems.rmsnorm_bwd import problem as bwd
    assert cli.gene_changes(bwd.space, ["narrow=true", "tail=peel", "threads=512"]) == \
        {"narrow": True, "tail": "peel", "threads": 512}
    assert cli.gene_changes(bwd.space, ["narrow=True"]) == {"narrow": True}
    with pytest.raises(cli.ConfigError, match=r"'rows_per_cta' must be one of \['1', '2'"):
        cli.gene_changes(bwd.space, ["rows_per_cta=true"])
    with pytest.raises(cli.ConfigError, match="'narrows' must be a gene of threads"):
        cli.gene_changes(bwd.space, ["narrows=true"])


def test_twin_keep_leaves_each_original_as_a_tuning_candidate_of_the_dtypes_that_ran_it(capsys, monkeypatch, tmp_path):
    """`twin --keep`: the rule runs the twins, and first-call tuning can still pick an original where it is faster
    (two odd-width held-out rows of 2026-12-07 got slower when the twin replaced their genome)."""
    from kernel_factory.problems.rmsnorm_bwd import problem as bwd
    path = SHIPPED.parent / "rmsnorm_bwd.json"
    before, table = dispatch.load(path), dispatch.load(path)
    renamed = dispatch.twin(table, bwd, {"narrow": False}, keep=True)   # the shipped genomes are narrow=True
    assert renamed and table["twinned"][-1] == {"changes": {"narrow": False}, "genomes": len(renamed), "kept": True}
    for dtype, entry in before["dtypes"].items():
        old = dispatch.op_table.chosen_genomes(entry)
        now = table["dtypes"][dtype]
        ran = [g for g in dict.fromkeys(old) if g in renamed]
        assert ran and now["candidates"][-len(ran):] == ran           # the originals, after the twins' ids
        assert set(dispatch.op_table.chosen_genomes(now)) == {renamed.get(g, g) for g in old} | set(ran)
        assert all(g in table["genomes"] and renamed[g] in table["genomes"] for g in ran)
    built = []
    monkeypatch.setattr(dispatch, "build", lambda problem, t, folder: built.append(folder) or t)   # no NVRTC here
    out = tmp_path / "rmsnorm_bwd.json"
    assert cli.main(["twin", "--problem", "rmsnorm_bwd", "--set", "narrow=false", "--keep", "--table", str(path),
                     "--out", str(out)]) == 0
    assert "added, each original kept as a tuning candidate" in capsys.readouterr().out and built
    assert json.loads(out.read_text())["twinned"][-1]["kept"] is True
