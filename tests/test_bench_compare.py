"""`kernel-factory bench --compare`: rows of two bench (or suite) results matched by problem and case; a fall in the
ratio to the best peer larger than the bar (2%, or both benches' spread where wider) is a regression; the section
lands in the markdown and the JSON."""
from __future__ import annotations

import copy
import json

import pytest

from kernel_factory.evo.tools import bench_compare, bench_report, cli
from kernel_factory.evo.tools.bench import SUBJECT


def bench(ours: dict[int, float], iqr: float = 0.0) -> dict:
    """Rows 1024xN: ours as given, the peer int21 at 100 µs; iqr (µs) on both sides."""
    rows = [{"case": f"bfloat16:1024x{n}", "dtype": "bfloat16", "shape": [1024, n], "bytes": 1 << 20,
             "providers": {SUBJECT: {"us": us, "iqr_us": iqr}, "int21": {"us": 100.0, "iqr_us": iqr},
                           "torch_eager": {"us": 50.0}}}
            for n, us in ours.items()]
    return {"format": "kernel-factory-bench/1", "problem": "rmsnorm_fwd", "subject": "t", "peers": ["int21"],
            "baselines": ["int21", "torch_eager"], "reps": 20, "repeat": 1, "graph_below_us": 30.0,
            "copy_gbps": 4000.0, "fingerprint": {"gpu": "TEST GPU", "date": "2026-12-01"}, "rows": rows}


def test_regressions_improvements_and_the_bar():
    before = bench({256: 100.0, 512: 100.0, 1024: 100.0, 2048: 100.0, 4096: 100.0})
    now = bench({256: 105.0, 512: 97.0, 1024: 101.0, 8192: 90.0})
    cmp = bench_compare.compare(now, before, "before.json")
    by_case = {r["case"].split("x")[1]: r for r in cmp["rows"]}
    assert by_case["256"]["verdict"] == "regression" and by_case["256"]["change_pct"] == pytest.approx(-4.76, abs=0.01)
    assert by_case["512"]["verdict"] == "improvement" and by_case["1024"]["verdict"] == "same"
    assert cmp["counts"] == {"regression": 1, "improvement": 1, "same": 1}
    assert cmp["only_now"] == 1 and cmp["only_before"] == 2
    assert [r["case"] for r in cmp["rows"]][0].endswith("x256")   # largest fall first
    # the same fall inside the benches' spread (3% IQR on each side, twice) is not called a regression
    noisy = bench_compare.compare(bench({256: 105.0}, iqr=3.0), bench({256: 100.0}, iqr=3.0), "b")
    assert noisy["rows"][0]["verdict"] == "same" and noisy["rows"][0]["bar_pct"] > 4.76


def test_the_best_peer_is_taken_per_bench():
    """A faster torch eager is not a published peer: it does not move the ratio."""
    before, now = bench({256: 100.0}), bench({256: 100.0})
    now["rows"][0]["providers"]["torch_eager"]["us"] = 1.0
    assert bench_compare.compare(now, before, "b")["rows"][0]["change_pct"] == 0.0


def test_only_peers_timed_in_both_benches_set_the_bar():
    """A peer that only the new bench timed (QuACK, say, installed since) would move the ratio without any change
    of ours: the best is taken among the peers timed in both."""
    before, now = bench({256: 100.0}), bench({256: 100.0})
    now["peers"] = ["int21", "quack"]
    now["rows"][0]["providers"]["quack"] = {"us": 50.0}
    (row,) = bench_compare.compare(now, before, "b")["rows"]
    assert row["peers"] == ["int21"] and row["change_pct"] == 0.0 and row["verdict"] == "same"


def test_host_paths_split_each_providers_change_by_its_earlier_host_path():
    """An eager provider whose host path outlasted the earlier bench's flush moved (its host time left the events);
    its rows within the flush held; graph replays and rows of one bench only are left out."""
    before, now = bench({256: 100.0, 512: 100.0, 1024: 100.0}), bench({256: 100.0, 512: 100.0, 1024: 100.0})
    for b in (before, now):
        b["flush_us"] = 85.0
    hosts = {256: 200.0, 512: 150.0, 1024: 10.0}   # torch_eager's host path per call in the earlier bench
    for row in before["rows"]:
        row["providers"]["torch_eager"]["host_us"] = hosts[row["shape"][1]]
    for row in now["rows"]:
        if row["shape"][1] != 1024:
            row["providers"]["torch_eager"]["us"] = 45.0
    now["rows"][0]["providers"]["int21"]["graph"] = True
    by = {h["provider"]: h for h in bench_compare.compare(now, before, "b")["host_paths"]}
    assert by["torch_eager"]["slow"] == pytest.approx(0.9) and by["torch_eager"]["slow_rows"] == 2
    assert by["torch_eager"]["fast"] == 1.0 and by["torch_eager"]["fast_rows"] == 1
    assert by["int21"]["fast_rows"] == 2 and by["int21"]["slow"] is None   # its graph-replayed row is left out
    lines = "\n".join(bench_compare.section(bench_compare.compare(now, before, "b")))
    assert "| torch_eager | 0.900 | 2 | 1.000 | 1 |" in lines


def test_cli_compare_writes_the_section(tmp_path, capsys):
    (tmp_path / "before.json").write_text(json.dumps(bench({256: 100.0, 512: 100.0})))
    (tmp_path / "now.json").write_text(json.dumps(bench({256: 110.0, 512: 100.0})))
    assert cli.main(["bench", "--from", str(tmp_path / "now.json"), "--compare", str(tmp_path / "before.json"),
                     "--out", str(tmp_path / "out")]) == cli.EXIT_FAILED, "a regression fails the command (CI)"
    assert "1 row(s) regressed by more than 2%" in capsys.readouterr().err
    assert cli.main(["bench", "--from", str(tmp_path / "now.json"), "--compare", str(tmp_path / "before.json"),
                     "--out", str(tmp_path / "out"), "--report-only"]) == 0
    md = (tmp_path / "out/bench.md").read_text()
    assert f"## Against {tmp_path / 'before.json'}" in md and "2 rows in both: **1 regression**, 0 improvements, 1 within" in md
    assert "| rmsnorm_fwd | bfloat16:1024x256 | 1.000 | 0.909 | -9.1% | ±2.0% | 100.0 → 110.0 | **regression** |" in md
    saved = json.loads((tmp_path / "out/bench.json").read_text())
    assert saved["compared"]["counts"]["regression"] == 1
    assert bench_report.markdown(saved) == md   # re-rendering the written JSON keeps the section


def test_a_suite_compares_part_by_part(tmp_path, capsys):
    fwd, bwd = bench({256: 100.0}), {**bench({256: 100.0}), "problem": "rmsnorm_bwd"}
    for name, data in (("fwd.json", fwd), ("bwd.json", bwd)):
        (tmp_path / name).write_text(json.dumps(data))
    slower = copy.deepcopy(bwd)
    slower["rows"][0]["providers"][SUBJECT]["us"] = 120.0
    (tmp_path / "bwd-before.json").write_text(json.dumps(slower))
    assert cli.main(["bench", "--from", str(tmp_path / "fwd.json"), str(tmp_path / "bwd.json"),
                     "--compare", str(tmp_path / "bwd-before.json")]) == 0
    out = capsys.readouterr().out
    assert "| rmsnorm_bwd | bfloat16:1024x256 | 0.833 | 1.000 | +20.0% |" in out
    assert "1 row in both: **0 regressions**, 1 improvement" in out and "1 row only now" in out


def test_a_compare_file_that_is_not_a_bench(tmp_path, capsys):
    (tmp_path / "now.json").write_text(json.dumps(bench({256: 100.0})))
    (tmp_path / "x.json").write_text("{}")
    assert cli.main(["bench", "--from", str(tmp_path / "now.json"), "--compare", str(tmp_path / "x.json")]) == \
        cli.EXIT_BAD_INPUT
    assert "is not a bench or suite result" in capsys.readouterr().err
