"""`kernel-factory gap` on CPU: from a bench result and journals with known numbers it finds the rows under the
floor, the roofline ceilings, the search's best and closest variants (live runs on the bench's GPU only), and
whether a target is met; bad targets files get one-line errors; and on the committed H200 evidence its numbers
agree with the bench results and journals they come from."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import yaml

from kernel_factory.evo.tools import bench_suite, cli, gap
from kernel_factory.evo.types import Candidate, Genome
from test_export import result, write_journal

ROOT = Path(__file__).resolve().parent.parent
A, B, C = "bfloat16:32768x256", "bfloat16:32768x4096", "float16:32768x256"


def bench_row(case: str, ours: float | None, peers: dict[str, float], nbytes: int) -> dict:
    providers = {name: {"us": us} for name, us in peers.items()}
    if ours is not None:
        providers["factory"] = {"us": ours}
    dtype, dims = case.split(":")
    return {"case": case, "dtype": dtype, "shape": [int(d) for d in dims.split("x")], "bytes": nbytes,
            "providers": providers}


def write_bench(path: Path, rows: list[dict], gpu: str = "NVIDIA H200") -> Path:
    path.write_text(json.dumps({"format": "kernel-factory-bench/1", "problem": "rmsnorm_fwd", "subject": "test",
                                "baselines": ["int21", "quack", "torch_eager"], "peers": ["int21", "quack"],
                                "copy_gbps": 4000.0, "fingerprint": {"gpu": gpu, "date": "2026-12-01"},
                                "rows": rows}))
    return path


def genome(rmsnorm, **genes) -> Candidate:
    return Candidate(Genome.of({**rmsnorm.space.defaults(), **genes}))


@pytest.fixture
def setup(tmp_path, rmsnorm):
    """Bench: A below the floor (0.9), B above (1.05), C another dtype. Journals: a live H200 run with three genomes
    at A (one 2% off, one 6% off), a replayed run and a run on another GPU with faster times that must not count."""
    bench = write_bench(tmp_path / "bench.json", [
        bench_row(A, 10.0, {"int21": 9.0, "quack": 9.5, "torch_eager": 5.0}, 24_000_000),
        bench_row(B, 10.0, {"int21": 10.5, "quack": 11.0}, 38_000_000),
        bench_row(C, 10.0, {"int21": 1.0}, 24_000_000)])
    best, near, far = (genome(rmsnorm), genome(rmsnorm, load="nc_na"), genome(rmsnorm, threads=512))
    runs = tmp_path / "runs"
    write_journal(runs, "live", "gpu", [result(best, {A: 10.0, B: 10.0}), result(near, {A: 10.2}),
                                        result(far, {A: 10.6}), result(far, {A: 10.6}, status="incorrect")])
    write_journal(runs, "replayed", "replay", [result(genome(rmsnorm, unroll=1), {A: 1.0}, evaluator="replay")])
    other = write_journal(runs, "other-gpu", "gpu", [result(genome(rmsnorm, unroll=4), {A: 1.0})])
    other.write_text(other.read_text().replace("NVIDIA H200", "NVIDIA H100"))
    # the bench did not time QuACK's tuned entry point: the report says so (gap refuses it otherwise)
    targets = {"runs": [str(runs)], "reports": [{"name": "bf16", "bench": str(bench), "dtypes": ["bfloat16"],
                                                 "geomean": 1.0, "floor": 0.97, "without": ["quack_tuned"]}]}
    return tmp_path, targets, (best, near, far)


def write_targets(folder: Path, data: dict) -> Path:
    path = folder / "targets.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gap_rows_roofline_and_search(setup, rmsnorm):
    folder, targets, (best, near, far) = setup
    (rep,) = gap.analyse(gap.load_targets(write_targets(folder, targets)))["reports"]
    assert rep["rows"] == 2 and rep["rows_below_floor"] == 1 and not rep["met"]
    assert rep["geomean"] == pytest.approx(math.sqrt(0.9 * 1.05), abs=1e-4)
    assert rep["geomean_short_by"] == pytest.approx(1 / math.sqrt(0.9 * 1.05), abs=1e-4)
    worst, other = rep["gaps"]
    assert worst["case"] == A and worst["peer"] == "int21" and worst["ratio"] == pytest.approx(0.9)
    # torch_eager is faster but not a published peer: it does not set the bar
    assert worst["copy_us"] == pytest.approx(6.0) and worst["ceiling"] == pytest.approx(1.5)
    assert worst["ours_pct_copy"] == pytest.approx(60.0) and worst["speedup_to_floor"] == pytest.approx(0.97 / 0.9,
                                                                                                       abs=1e-4)
    assert other["case"] == B and not other["below_floor"] and other["speedup_to_floor"] == 1.0
    assert rep["geomean_ceiling"] == pytest.approx(math.sqrt(1.5 * 10.5 / 9.5), abs=1e-4)
    assert rep["ceiling_below_target"] == [] and rep["rest_needed"] is None
    s = worst["search"]
    assert s["runs"] == ["live"] and s["evaluations"] == 3 and s["genomes"] == 3
    assert s["best"]["genome"] == best.genome.id and s["best"]["us"] == 10.0
    assert s["within"] == 1 and [v["genome"] for v in s["close"]] == [near.genome.id]
    assert s["close"][0]["differs"] == {"load": [rmsnorm.space["load"].default, "nc_na"]}
    assert "load" not in s["settled"] and s["settled"]["threads"] == rmsnorm.space["threads"].default
    assert "unroll" in s["untried"] and 512 not in s["untried"].get("threads", [])
    assert other["search"]["evaluations"] == 1 and other["search"]["within"] == 0


def test_gap_met_and_the_roofline_verdict(setup):
    folder, targets, _ = setup
    targets["reports"][0].update(geomean=0.95, floor=0.9)
    analysis = gap.analyse(gap.load_targets(write_targets(folder, targets)))
    assert analysis["met"] and analysis["reports"][0]["met"]
    assert "**met**" in gap.markdown(analysis)
    targets["reports"][0].update(geomean=1.3, floor=1.2)   # above B's ceiling (10.5 / 9.5)
    analysis = gap.analyse(gap.load_targets(write_targets(folder, targets)))
    rep = analysis["reports"][0]
    assert not analysis["met"] and rep["ceiling_below_floor"] == rep["ceiling_below_target"] == [B]
    assert rep["rest_needed"] == pytest.approx(1.3 ** 2 / (10.5 / 9.5), abs=1e-4)   # A alone must make up for B
    assert "Out of reach by the roofline" in gap.markdown(analysis)


def test_a_copy_timed_at_the_rows_size_sets_the_ceiling(setup):
    """Benches that time a copy of each row's bytes beside the providers (provider 'copy') give the tight roofline:
    the ceiling uses that time rather than the bytes at the large copy's bandwidth."""
    folder, targets, _ = setup
    bench = json.loads((folder / "bench.json").read_text())
    bench["rows"][0]["providers"]["copy"] = {"us": 8.0}
    (folder / "bench.json").write_text(json.dumps(bench))
    (rep,) = gap.analyse(gap.load_targets(write_targets(folder, targets)))["reports"]
    a, b = rep["gaps"]
    assert a["copy_us"] == 8.0 and a["ceiling"] == pytest.approx(9.0 / 8.0) and a["copy"] == "timed at the row's size"
    assert b["copy_us"] == pytest.approx(9.5) and b["copy"] == "row bytes at the measured copy bandwidth"
    assert "Copy µs: row bytes at the measured copy bandwidth; timed at the row's size." in gap.markdown(
        {"close": 0.05, "journals": {}, "reports": [rep]})


def test_gap_cli_writes_the_report(setup, capsys):
    folder, targets, _ = setup
    assert cli.main(["gap", str(write_targets(folder, targets)), "--out", str(folder / "out")]) == cli.EXIT_FAILED
    assert "1 target(s) not met" in capsys.readouterr().err, "a missed target fails the command (CI)"
    assert cli.main(["gap", str(write_targets(folder, targets)), "--out", str(folder / "out"), "--report-only"]) == 0
    text = (folder / "out" / "gap.md").read_text()
    assert text in capsys.readouterr().out and "**not met**" in text and A in text
    assert json.loads((folder / "out" / "gap.json").read_text())["format"] == gap.FORMAT


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["reports"][0].update(flor=0.9), "'reports[0].flor' is unknown; valid keys under 'reports[0]'"),
    (lambda t: t["reports"][0].update(bench="missing.json"), "'reports[0].bench': no file 'missing.json'"),
    (lambda t: t["reports"][0].update(floor=0), "'reports[0].floor' must be > 0"),
    (lambda t: t["reports"][0].update(dtypes=["float32"]), "has no rows of dtypes ['float32']; it has bfloat16, "
                                                          "float16"),
    (lambda t: t.update(runs=["nowhere"]), "'runs': no folder 'nowhere'"),
    (lambda t: t.update(reports=[]), "'reports' must list at least one report"),
])
def test_bad_targets_get_one_line_errors(setup, capsys, edit, message):
    folder, targets, _ = setup
    edit(targets)
    assert cli.main(["gap", str(write_targets(folder, targets))]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_file_that_is_not_a_bench_result(setup, capsys):
    folder, targets, _ = setup
    (folder / "bench.json").write_text(json.dumps({"rows": []}))
    assert cli.main(["gap", str(write_targets(folder, targets))]) == cli.EXIT_BAD_INPUT
    assert "is not a bench or suite result" in capsys.readouterr().err


def test_a_target_picks_its_part_of_a_suite_result(setup, capsys):
    """A suite (kernel-factory bench --suite, or --from joining benches) holds several parts; problem and dtypes
    pick one, and a target that matches none or several is refused with the parts it could have named."""
    folder, targets, _ = setup
    bench = json.loads((folder / "bench.json").read_text())
    bf16 = {**bench, "rows": [r for r in bench["rows"] if r["dtype"] == "bfloat16"]}
    fp16 = {**bench, "rows": [r for r in bench["rows"] if r["dtype"] == "float16"]}
    (folder / "suite.json").write_text(json.dumps({"format": bench_suite.FORMAT, "suite": "t", "parts": [fp16, bf16]}))
    targets["reports"][0].update(bench=str(folder / "suite.json"), problem="rmsnorm_fwd")
    (rep,) = gap.analyse(gap.load_targets(write_targets(folder, targets)))["reports"]
    assert rep["rows"] == 2 and rep["rows_below_floor"] == 1
    targets["reports"][0].update(dtypes=None)
    assert cli.main(["gap", str(write_targets(folder, targets))]) == cli.EXIT_BAD_INPUT
    assert "parts rmsnorm_fwd (float16); rmsnorm_fwd (bfloat16): a report target on it needs 'problem' and 'dtypes' " \
           "that pick exactly one" in capsys.readouterr().err


def journal_times(path: Path, candidate: str, key: str) -> list[float]:
    """Every time a journal holds for one candidate at one case: its search result and its finalist re-time."""
    found = []
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        rec = json.loads(line)
        if rec["event"] == "result" and rec["candidate"]["id"] == candidate:
            found.append(rec["result"]["times_us"].get(key))
        if rec["event"] == "end":
            found += [f["times_us"].get(key) for f in rec.get("finalists", []) if f["candidate_id"] == candidate]
    return [t for t in found if t is not None]


def test_gap_on_the_committed_h200_evidence(monkeypatch):
    """The targets file the README quotes: geomeans and rows under the floor recomputed straight from the bench
    JSON, and each row's search best found, with that time, in the journal of the run it names."""
    monkeypatch.chdir(ROOT)
    targets = gap.load_targets("configs/targets/rmsnorm-h200.yaml")
    analysis = gap.analyse(targets)
    assert len(analysis["reports"]) == len(targets.reports) == 3
    for target, rep in zip(targets.reports, analysis["reports"]):
        bench = gap.read_bench(target.bench, target.problem, target.dtypes)
        rows = [r for r in bench["rows"] if r["dtype"] in target.dtypes]
        ratios = [min(r["providers"][p]["us"] for p in bench["peers"] if "us" in r["providers"].get(p, {}))
                  / r["providers"]["factory"]["us"] for r in rows]
        assert rep["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)), abs=1e-4)
        assert rep["rows_below_floor"] == sum(r < target.floor for r in ratios)
        assert rep["met"] == (rep["rows_below_floor"] == 0 and rep["geomean"] >= target.geomean)
        for row in rep["gaps"]:
            best = row["search"]["best"]
            times = journal_times(Path(analysis["journals"][best["run"]]), best["candidate"], row["case"])
            assert any(t == pytest.approx(best["us"], abs=1e-3) for t in times), row["case"]


def test_a_reader_that_stops_early_gets_no_traceback():
    """`kernel-factory gap ... | head` can close the pipe before the report is written: a quiet exit 141, as from
    a shell tool. Here the pipe's reader is closed before the command starts."""
    import os
    import subprocess
    import sys
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "kernel_factory.evo.tools.cli", "gap",
                               "configs/targets/rmsnorm-h200.yaml"], cwd=ROOT, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == cli.EXIT_BROKEN_PIPE and "Traceback" not in proc.stderr, proc.stderr
