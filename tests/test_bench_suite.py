"""`kernel-factory bench --suite` on CPU: every part checked before any timing, the parts run in order in one
process (a stand-in for bench.run records what each asked for), one report with a summary per part and dtype, one
CSV and chart, a suite stopped part-way keeps what it measured, and `--from` joins recorded bench JSONs."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from kernel_factory.evo.tools import bench, bench_report, bench_suite, cli, exits
from kernel_factory.evo.tools.bench import SUBJECT

ROOT = Path(__file__).resolve().parent.parent
FWD, BWD = str(ROOT / "kernels/ops/rmsnorm_fwd.json"), str(ROOT / "kernels/ops/rmsnorm_bwd.json")
EVIDENCE = [ROOT / "docs/results/bench/fwd-bf16.json", ROOT / "docs/results/bench/fwd-fp16-fp32.json",
            ROOT / "docs/results/bench/bwd.json"]


def suite_file(folder: Path, parts: list[dict], **top) -> Path:
    path = folder / "suite.yaml"
    path.write_text(yaml.safe_dump({**top, "parts": parts}))
    return path


def two_parts() -> list[dict]:
    return [{"problem": "rmsnorm_fwd", "table": FWD, "dtypes": ["bfloat16", "float16"],
             "baselines": ["int21", "torch_eager"]},
            {"problem": "rmsnorm_bwd", "table": BWD, "dtypes": ["bfloat16"], "shapes": "1024x4096,64x8192",
             "reps": 7}]


def fake_result(problem: str, dtypes, n_rows: int = 2) -> dict:
    """A bench result with known ratios: ours 10 µs, int21 9 µs in even rows and 12 µs in odd ones."""
    rows = []
    for dtype in dtypes:
        for i in range(n_rows):
            rows.append({"case": f"{dtype}:1024x{256 << i}", "dtype": dtype, "shape": [1024, 256 << i],
                         "bytes": 1 << 20, "providers": {SUBJECT: {"us": 10.0, "pct_copy": 50.0 + i},
                                                         "int21": {"us": 9.0 if i % 2 == 0 else 12.0}}})
    return {"format": "kernel-factory-bench/1", "problem": problem, "subject": f"table of {problem}",
            "baselines": ["int21"], "peers": ["int21"], "declared": ["int21"], "without": {},
            "labels": {"int21": "INT21"}, "reps": 20, "repeat": 1, "graph_below_us": 30.0,
            "copy_gbps": 4000.0, "wall_s": 1.0, "fingerprint": {"gpu": "TEST GPU", "date": "2026-12-01"},
            "rows": rows}


@pytest.fixture
def fake_bench(monkeypatch):
    """bench.run replaced: each call is recorded, its rows streamed through on_row as the real one does."""
    calls = []

    def run(problem, subject, shapes, dtypes, baselines, reps, repeat, graph_below_us, on_row=None, without=()):
        calls.append({"problem": problem, "subject": subject, "shapes": shapes, "dtypes": dtypes,
                      "baselines": baselines, "reps": reps, "repeat": repeat, "graph": graph_below_us,
                      "without": without})
        full = fake_result(problem, dtypes)
        for k in range(1, len(full["rows"])):
            on_row({**full, "rows": full["rows"][:k], "partial": f"{k} of {len(full['rows'])} cases"})
        return full
    monkeypatch.setattr(bench, "run", run)
    return calls


def test_a_suite_runs_its_parts_in_order_and_writes_one_report(tmp_path, fake_bench, capsys):
    path = suite_file(tmp_path, two_parts(), reps=11)
    assert cli.main(["bench", "--suite", str(path), "--out", str(tmp_path / "out"), "--repeat", "2"]) == 0
    assert [(c["problem"], c["dtypes"], c["reps"], c["repeat"]) for c in fake_bench] == \
        [("rmsnorm_fwd", ["bfloat16", "float16"], 11, 2), ("rmsnorm_bwd", ["bfloat16"], 7, 2)]
    assert fake_bench[0]["subject"]["table"] == FWD and fake_bench[0]["baselines"] == ["int21", "torch_eager"]
    assert fake_bench[1]["shapes"] == "1024x4096,64x8192" and fake_bench[1]["baselines"] is None
    result = json.loads((tmp_path / "out/bench.json").read_text())
    assert result["format"] == bench_suite.FORMAT and "partial" not in result and len(result["parts"]) == 2
    md = (tmp_path / "out/bench.md").read_text()
    assert md in capsys.readouterr().out
    summary = [line for line in md.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    want = f"{math.sqrt(0.9 * 1.2):.3f}"
    assert summary == [
        f"| 0 | rmsnorm_fwd | bfloat16 | 2 of 2 | {want} | 0.900 (bfloat16:1024x256) | 50–51% | all ran |",
        f"| 0 | rmsnorm_fwd | float16 | 2 of 2 | {want} | 0.900 (float16:1024x256) | 50–51% | all ran |",
        f"| 1 | rmsnorm_bwd | bfloat16 | 2 of 2 | {want} | 0.900 (bfloat16:1024x256) | 50–51% | all ran |"]
    assert "## Part 0: table of rmsnorm_fwd" in md and "## Part 1: table of rmsnorm_bwd" in md
    lines = (tmp_path / "out/bench.csv").read_text().splitlines()
    rows = list(csv.DictReader(io.StringIO("\n".join(l for l in lines if not l.startswith("#")))))
    assert len(rows) == 2 * (4 + 2) and {r["problem"] for r in rows} == {"rmsnorm_fwd", "rmsnorm_bwd"}
    assert sum(l.startswith("# part ") for l in lines) == 2
    assert (tmp_path / "out/bench.png").stat().st_size > 1000


def test_a_suite_stopped_in_its_second_part_keeps_the_first(tmp_path, monkeypatch, capsys):
    def run(problem, subject, shapes, dtypes, baselines, reps, repeat, graph_below_us, on_row=None, without=()):
        full = fake_result(problem, dtypes)
        if problem == "rmsnorm_bwd":
            on_row({**full, "rows": full["rows"][:1], "partial": "1 of 2 cases"})
            assert json.loads((tmp_path / "s.json").read_text())["partial"] == "1 of 2 parts in full"
            raise KeyboardInterrupt
        return full
    monkeypatch.setattr(bench, "run", run)
    path = suite_file(tmp_path, two_parts())
    assert cli.main(["bench", "--suite", str(path), "--out", str(tmp_path), "--stem", "s"]) == exits.EXIT_INTERRUPTED
    assert "the report covers what was measured (1 of 2 parts in full)" in capsys.readouterr().err
    result = json.loads((tmp_path / "s.json").read_text())
    assert [len(p["rows"]) for p in result["parts"]] == [4, 1] and result["parts"][1]["partial"] == "1 of 2 cases"
    md = (tmp_path / "s.md").read_text()
    assert "**Partial**: 1 of 2 parts in full" in md and "| 1 | rmsnorm_bwd | bfloat16 | 1 of 1 |" in md


@pytest.mark.parametrize("edit, message", [
    (lambda p: p[1].update(dtype=["bfloat16"]), "'parts[1].dtype' is unknown; valid keys under 'parts[1]'"),
    (lambda p: p[1].update(op=True), "part 1 (rmsnorm_bwd): bench needs exactly one subject"),
    (lambda p: p[0].update(dtypes=["bf16"]), "part 0 (rmsnorm_fwd):"),
    (lambda p: p[1].update(baselines=["int22"]), "part 1 (rmsnorm_bwd): --baselines: rmsnorm_bwd has no baseline "
                                                 "'int22'; it has torch_eager"),
    (lambda p: p[0].update(problem="layernorm"), "part 0 (layernorm):"),
    (lambda p: p[1].update(genes={"threads": 3}, table=None), "part 1 (rmsnorm_bwd): --genes: threads=3 is not one"),
    (lambda p: p.clear(), "'parts' must list at least one part"),
])
def test_a_bad_part_is_refused_before_anything_is_timed(tmp_path, fake_bench, capsys, edit, message):
    parts = two_parts()
    edit(parts)
    assert cli.main(["bench", "--suite", str(suite_file(tmp_path, parts))]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert fake_bench == []


def test_suite_and_a_single_bench_subject_do_not_mix(tmp_path, fake_bench, capsys):
    path = suite_file(tmp_path, two_parts())
    assert cli.main(["bench", "--suite", str(path), "--table", FWD]) == cli.EXIT_BAD_INPUT
    assert "--suite takes every part's settings from its file; drop --table" in capsys.readouterr().err
    assert fake_bench == []


def test_from_joins_recorded_benches_and_rerenders_a_suite(tmp_path, capsys):
    """The committed H200 benches joined: each summary row is that bench's own geomean over the dtype's rows; the
    suite JSON written re-renders to the same report."""
    assert cli.main(["bench", "--from", *map(str, EVIDENCE), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "bench.md").read_text()
    for i, path in enumerate(EVIDENCE):
        recorded = json.loads(path.read_text())
        peers = bench_report.peer_set(recorded)
        for dtype in sorted({r["dtype"] for r in recorded["rows"]}):
            ratios = [bench_report.best_peer(r, peers)[1] / r["providers"][SUBJECT]["us"]
                      for r in recorded["rows"] if r["dtype"] == dtype]
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            assert f"| {i} | {recorded['problem']} | {dtype} | {len(ratios)} of {len(ratios)} | {gm:.3f} |" in md
    capsys.readouterr()
    assert cli.main(["bench", "--from", str(tmp_path / "bench.json")]) == 0
    assert md in capsys.readouterr().out


def test_from_refuses_what_is_not_a_bench(tmp_path, capsys):
    (tmp_path / "x.json").write_text(json.dumps({"rows": []}))
    assert cli.main(["bench", "--from", str(tmp_path / "x.json")]) == cli.EXIT_BAD_INPUT
    assert "is not a bench or suite result" in capsys.readouterr().err


def test_the_fingerprint_names_the_tables_the_op_loads(tmp_path, monkeypatch):
    """A bench's fingerprint says which dispatch table each exported op loads (path and content hash), so that a table
    copied somewhere the op does not look shows up as the shipped one; a changed table changes its hash."""
    import hashlib
    from kernel_factory.kernels import runtime
    ops = tmp_path / "ops"
    ops.mkdir()
    for name in ("rmsnorm_fwd", "rmsnorm_bwd"):
        (ops / f"{name}.json").write_bytes(Path(FWD if name == "rmsnorm_fwd" else BWD).read_bytes())
    monkeypatch.setattr(runtime, "OPS_DIR", ops)
    found = bench.op_tables()
    assert set(found) == {"op.rmsnorm_fwd", "op.rmsnorm_bwd"}
    want = hashlib.sha256(Path(BWD).read_bytes()).hexdigest()[:16]
    assert found["op.rmsnorm_bwd"] == f"{ops / 'rmsnorm_bwd.json'} sha256 {want}"
    (ops / "rmsnorm_bwd.json").write_text("{}")
    assert bench.op_tables()["op.rmsnorm_bwd"].split()[-1] != want
