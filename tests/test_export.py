"""`kernel-factory export` on CPU: from synthetic journals with known numbers it picks each N's fastest genome (at the
largest M) and the right general genome, prefers finalists' re-timed medians, labels replayed data, records
provenance, fills new genes; the dispatch lookup; recordings as a source; one-line CLI errors; and --build writes
deterministic sm_90a cubins that the op trusts only while they match the template."""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import tarfile
from pathlib import Path

import pytest

from kernel_factory.kernels import table as op_table
from kernel_factory.evo.tools import cli, dispatch, export
from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.types import Candidate, Case, EvalResult, Genome, Status

ROOT = Path(__file__).resolve().parent.parent
BENCH = [Case(s, "bfloat16").key for s in ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048),
                                           (32768, 4096), (32768, 8192), (32768, 16384), (32768, 32768),
                                           (32768, 65536), (16384, 131072), (8192, 262144))]


def result(cand: Candidate, times: dict, status: str = "ok", evaluator: str = "gpu", flags=()) -> dict:
    res = EvalResult(cand.id, Status(status), 1.0 if status == "ok" else 0.0, times if status == "ok" else {},
                     evaluator=evaluator).to_json()
    if flags:
        res["flags"] = list(flags)
    return {"event": "result", "generation": 0, "candidate": cand.to_json(), "result": res}


def write_journal(folder, run_id: str, kind: str, rows: list[dict], finalists=(), problem="rmsnorm_fwd"):
    path = folder / run_id / "journal.jsonl"
    path.parent.mkdir(parents=True)
    start = {"event": "start", "run_id": run_id, "problem": problem, "seed": 0, "config": {},
             "evaluator": {"kind": kind, "label": f"{kind} test", "fingerprint": {"gpu": "NVIDIA H200"}},
             "cases": BENCH}
    end = {"event": "end", "generations": 1, "evaluations": len(rows), "stop_reason": "generations", "wall_s": 1.0,
           "gpu_s": 1.0, "best": None, "finalists": list(finalists)}
    path.write_text("".join(json.dumps(r) + "\n" for r in [start, *rows, end]))
    return path


def everywhere(t: float, **special: float) -> dict:
    return {k: special.get(k, t) for k in BENCH}


@pytest.fixture
def genomes(rmsnorm) -> dict[str, Candidate]:
    d = rmsnorm.space.defaults()
    variants = {"A": {}, "B": {"threads": 512}, "C": {"unroll": 1}, "D": {"store": "cs"}, "E": {"vec_bytes": 8},
                "F": {"rsqrt": "precise"}, "G": {"load": "plain"}, "H": {"reduce": "smem"}, "K": {"keep_x": False}}
    out = {}
    for name, change in variants.items():
        genes = {**d, **change}
        assert rmsnorm.space.why_infeasible(genes) is None, name
        out[name] = Candidate(Genome.of(genes), operator="test")
    return out


@pytest.fixture
def runs(tmp_path, genomes, rmsnorm):
    g = genomes
    partial = {k: v for k, v in rmsnorm.space.defaults().items() if k != "unroll"} | {"threads": 128}
    filled = Candidate(Genome(tuple(sorted(partial.items()))), operator="old-space")
    alien = Candidate(Genome.of({**rmsnorm.space.defaults(), "foo": 1}), operator="other-space")
    rows = [result(g["A"], everywhere(100.0, **{BENCH[0]: 1.0}) | {"float16:32768x2048": 5.0}),
            result(g["B"], everywhere(100.0, **{BENCH[4]: 1.0})),
            result(g["C"], everywhere(2.0), flags=["bfloat16: binary lacks LDG (test)"]),
            result(g["D"], {BENCH[2]: 0.5}),
            result(g["E"], everywhere(1.5)),             # re-timed as a finalist at 3.0
            result(g["F"], everywhere(1.2)),             # its finalist re-timing failed
            result(g["G"], {"bfloat16:1024x4096": 0.1, "bfloat16:64x5000": 0.3}),
            result(g["H"], everywhere(0.01), status="incorrect"),
            result(filled, {BENCH[5]: 0.2}),
            result(alien, everywhere(0.01))]
    finalists = [{"candidate_id": g["E"].id, "status": "ok", "reps": 100, "times_us": everywhere(3.0)},
                 {"candidate_id": g["F"].id, "status": "crashed", "message": "boom"}]
    write_journal(tmp_path / "runs", "live", "gpu", rows, finalists)
    write_journal(tmp_path / "runs", "replayed", "replay", [result(g["K"], {BENCH[1]: 0.7}, evaluator="replay")])
    return tmp_path / "runs"


@pytest.fixture
def table(runs, tmp_path):
    _, table = export.export("rmsnorm_fwd", ["live", "replayed"], tmp_path / "ops" / "rmsnorm_fwd.json", runs)
    return table


def test_each_n_gets_its_fastest_genome_at_the_largest_m(table, genomes):
    by_n = table["dtypes"]["bfloat16"]["by_n"]
    g = genomes
    assert by_n["256"]["genome"] == g["A"].id and by_n["256"]["time_us"] == 1.0
    assert by_n["4096"]["genome"] == g["B"].id and by_n["4096"]["case"] == "bfloat16:32768x4096"  # not G at M=1024
    assert by_n["1024"]["genome"] == g["D"].id          # measured on one case only: fine for that N
    assert by_n["5000"]["genome"] == g["G"].id and by_n["5000"]["case"] == "bfloat16:64x5000"
    assert by_n["512"]["genome"] == g["K"].id
    # C (2.0) beats E everywhere else: E's finalist re-time (3.0) replaced its search time (1.5); F is left out.
    assert {by_n[str(Case.parse(k).shape[1])]["genome"] for k in BENCH[6:]} == {g["C"].id}
    assert g["H"].id not in table["genomes"] and g["F"].id not in table["genomes"]


def test_general_is_the_best_geomean_among_full_coverage(table, genomes):
    gen = table["dtypes"]["bfloat16"]["general"]
    assert gen["genome"] == genomes["C"].id and gen["geomean_us"] == pytest.approx(2.0)
    assert set(gen["times_us"]) == set(BENCH)
    assert gen["provenance"]["flags"] == ["bfloat16: binary lacks LDG (test)"]


def test_provenance_and_replay_label(table, genomes, runs, rmsnorm):
    by_n = table["dtypes"]["bfloat16"]["by_n"]
    live = by_n["256"]["provenance"]
    assert live == {"run_id": "live", "candidate_id": genomes["A"].id, "evaluator": "gpu", "gpu": "NVIDIA H200",
                    "source": live["source"], "timing": "search"}
    assert live["source"].endswith("live/journal.jsonl")
    assert by_n["512"]["provenance"]["evaluator"] == "replay" and by_n["512"]["provenance"]["run_id"] == "replayed"
    assert "REPLAYED" in table["evaluator_kinds"]["replay"]
    assert any("not fresh measurements" in n for n in table["notes"])
    timing = {m.candidate_id: m.notes["timing"] for m in export.read_source("live", rmsnorm, runs)[1]}
    assert timing[genomes["E"].id].startswith("finalist re-time: 100 repetitions")
    assert table["sources"][0]["skipped"] == {"genes ['foo'] are no longer in the space": 1,
                                              "finalist re-timing failed (crashed)": 1}


def test_genomes_of_an_older_space_get_the_new_genes_defaults(table, rmsnorm):
    entry = table["dtypes"]["bfloat16"]["by_n"]["8192"]
    assert entry["provenance"]["genes_filled_with_defaults"] == ["unroll"]
    genes = table["genomes"][entry["genome"]]["genes"]
    assert genes["unroll"] == rmsnorm.space["unroll"].default and genes["threads"] == 128
    assert entry["provenance"]["candidate_id"] != entry["genome"]   # the id of the measured (shorter) genome


def test_dtypes_without_full_measurements_use_the_default_genome(table, rmsnorm, genomes):
    default = Genome.of(rmsnorm.space.defaults()).id
    fp16, fp32 = table["dtypes"]["float16"], table["dtypes"]["float32"]
    assert fp16["by_n"]["2048"]["genome"] == genomes["A"].id
    assert fp16["general"] == {"genome": default, "provenance": {
        "evaluator": "none", "note": "no genome was measured on all its benchmark cases"}}
    assert fp32["general"]["genome"] == default and fp32["by_n"] == {}
    assert fp32["general"]["provenance"]["note"] == "no run has measured this dtype yet"
    assert any(n.startswith("float32: the general genome is the problem's default genome") for n in table["notes"])


def test_lookup_exact_n_then_general(table, tmp_path, genomes, rmsnorm):
    loaded = dispatch.load(tmp_path / "ops" / "rmsnorm_fwd.json")
    assert loaded == table
    genome, why = dispatch.lookup(loaded, "bfloat16", 4096)
    assert genome.id == genomes["B"].id and why == "N=4096"
    genome, why = dispatch.lookup(loaded, "bfloat16", 4097)
    assert genome.id == genomes["C"].id and why == "general"
    assert dispatch.lookup(loaded, "float32", 7)[0] == Genome.of(rmsnorm.space.defaults())
    assert dispatch.lookup(loaded, "int8", 7) is None


def test_bad_tables_are_refused(tmp_path, table):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(dispatch.TableError, match="is not a dispatch table"):
        dispatch.load(bad)
    broken = json.loads(dispatch.dumps(table))
    broken["genomes"].pop(broken["dtypes"]["bfloat16"]["general"]["genome"])
    bad.write_text(json.dumps(broken))
    with pytest.raises(dispatch.TableError, match="names genomes"):
        dispatch.load(bad)
    with pytest.raises(dispatch.TableError, match="cannot read"):
        dispatch.load(tmp_path / "missing.json")


def test_sources_resolve_by_id_folder_or_file(runs, rmsnorm):
    for spec in ("live", str(runs / "live"), str(runs / "live" / "journal.jsonl")):
        source, found, _ = export.read_source(spec, rmsnorm, runs)
        assert source.run_id == "live" and len(found) == 7
    with pytest.raises(export.ExportError, match="runs under .*: live, replayed"):
        export.read_source("nope", rmsnorm, runs)
    other = write_journal(runs, "softmax-run", "gpu", [], problem="softmax")
    with pytest.raises(export.ExportError, match="holds problem 'softmax'.*--problem softmax"):
        export.read_source(str(other), rmsnorm, runs)
    junk = runs / "junk.txt"
    junk.write_text("hello\n")
    with pytest.raises(export.ExportError, match="neither a run journal nor a recording"):
        export.read_source(str(junk), rmsnorm, runs)


def test_a_recording_is_a_source_with_every_genome(synthetic_recording, rmsnorm, tmp_path):
    _, table = export.export("rmsnorm_fwd", [str(synthetic_recording)], tmp_path / "t.json")
    rec = recording.read(synthetic_recording)
    ok = [(g, r) for g, r in rec.entries.values() if r.status is Status.OK]
    for key in BENCH:
        t = min(r.times_us[key] for _, r in ok)
        entry = table["dtypes"]["bfloat16"]["by_n"][str(Case.parse(key).shape[1])]
        assert entry["time_us"] == pytest.approx(t, abs=1e-4)
        assert entry["provenance"]["evaluator"] == "recording" and entry["provenance"]["gpu"] == "SYNTHETIC test data"
    geo = {g.id: math.exp(sum(math.log(r.times_us[k]) for k in BENCH) / len(BENCH)) for g, r in ok}
    assert table["dtypes"]["bfloat16"]["general"]["genome"] == min(geo, key=lambda i: (geo[i], i))   # ties: id


def test_cli_export_and_its_one_line_errors(runs, tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert cli.main(["export", "--problem", "rmsnorm_fwd", "live", "--runs", str(runs), "--out", str(out)]) == 0
    assert "dispatch table ->" in capsys.readouterr().out and dispatch.load(out)
    assert cli.main(["export", "--problem", "rmsnorm_fwd", "ghost", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kernel-factory: error: no run or recording 'ghost'") and err.count("\n") == 1
    assert cli.main(["export", "--problem", "nosuch", "live", "--runs", str(runs)]) == 2
    assert "unknown problem 'nosuch'" in capsys.readouterr().err


def small_table(rmsnorm, genomes) -> dict:
    m = [export.Measurement(export.Source("s", "r", "gpu", "H200", ""), c.id, c.genome, everywhere(t), "gpu")
         for c, t in ((genomes["A"], 2.0), (genomes["B"], 3.0))]
    m.append(export.Measurement(m[0].source, "x", genomes["C"].genome, {BENCH[0]: 0.5}, "gpu"))
    return export.make_table(rmsnorm, m, [])


def test_build_writes_deterministic_kernels_the_op_runs_alone(tmp_path, rmsnorm, genomes):
    """--build writes, per (genome, dtype), a cubin, its gzip'd source and its launch recipe, identically twice; the
    op's own reader (kernels/table.py) loads the result with no plugin."""
    table = small_table(rmsnorm, genomes)
    stale = tmp_path / "a" / "cubins" / "rmsnorm_fwd-0000000000000000-bfloat16.cubin"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    first = dispatch.build(rmsnorm, json.loads(dispatch.dumps(table)), tmp_path / "a" / "cubins")
    second = dispatch.build(rmsnorm, json.loads(dispatch.dumps(table)), tmp_path / "b" / "cubins")
    pairs = dispatch.used(table)
    assert len(pairs) == 4   # A general + C at N=256 (bf16), the default genome for fp16 and fp32
    assert first["kernels"] == second["kernels"] and not stale.exists()
    for genome_id, dtype in pairs:
        rec = first["kernels"][f"{genome_id}:{dtype}"]
        a, b = (tmp_path / d / rec["cubin"] for d in "ab")
        assert a.name == f"rmsnorm_fwd-{genome_id}-{dtype}.cubin" and a.read_bytes() == b.read_bytes()
        assert a.read_bytes()[:4] == b"\x7fELF" and hashlib.sha256(a.read_bytes()).hexdigest() == rec["sha256"]
        assert rec["arch"] == "sm_90a"
        assert rec["recipe"] == rmsnorm.recipe(dispatch.genome(first, genome_id).gene_dict, dtype)
        src = gzip.decompress((tmp_path / "a" / rec["source"]).read_bytes()).decode()
        assert src == dispatch.source(rmsnorm, dispatch.genome(first, genome_id), dtype)
    (tmp_path / "a" / "t.json").write_text(dispatch.dumps(first))
    kernel = op_table.Table(tmp_path / "a" / "t.json").kernel("bfloat16", 256)
    assert kernel.genome == genomes["C"].id and kernel.why == "N=256" and kernel.cubin()[:4] == b"\x7fELF"


def test_shipped_table_is_valid_and_its_cubins_intact(rmsnorm):
    path = ROOT / "kernels" / "ops" / "rmsnorm_fwd.json"
    table = dispatch.load(path)
    assert set(table["dtypes"]) == set(rmsnorm.dtypes)
    # the shipped forward table is a workload campaign's learned rule: one per dtype, learned from H200 panels
    campaign = ROOT / table["sources"][0]
    assert json.loads((campaign / "workload.json").read_text())["config"]["problem"] == "rmsnorm_fwd"
    assert "H200" in (campaign / "gpu.txt").read_text()
    with tarfile.open(campaign / "panels.tar.xz") as packed:   # the panels it learned from, packed beside it
        panels = set(packed.getnames())
    for dtype in rmsnorm.dtypes:
        entry = table["dtypes"][dtype]
        assert "rule" in entry and entry["fit"]["cases"] >= 32
        assert f"panel-{dtype}.jsonl" in panels
    for rec in table["kernels"].values():
        data = (path.parent / rec["cubin"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == rec["sha256"]
    assert len(table["kernels"]) == len(dispatch.used(table))
