"""No report without its peers, on CPU: stand-in peer modules on sys.path (one that cannot load, as QuACK without its
CUDA toolkit flavour) and a stand-in for the bench's timing process. A peer that cannot load stops bench and heldout
before anything is timed, in one line naming it, why and the --without that accepts it; --without puts the peer in
every headline and the JSON; a peer that crashes on one row is recorded there, the bench goes on in a fresh
process, and the headline says so; a peer that runs on no row fails the command once the report is written; gap
refuses a bench that lacks a published peer unless told; recorded results older than these records still render."""
from __future__ import annotations

import json
import math
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from kernel_factory.evo.tools import bench, bench_process, bench_report, cli, gap, peers
from kernel_factory.evo.tools.bench import COPY, SUBJECT

ROOT = Path(__file__).resolve().parent.parent
FWD = str(ROOT / "kernels/ops/rmsnorm_fwd.json")
CTK = "No CTK flavor installed: expected one or more of _cutlass_ir.cu{N}.so"
CRASH = "crashed: AcceleratorError: CUDA error: an illegal memory access was encountered"
FLUSH_US = random.uniform(40.0, 80.0)   # the L2 flush's GPU time the stand-in timing process reports


@pytest.fixture
def fake_peers(tmp_path, monkeypatch):
    """Stand-in INT21, QuACK and Liger modules; QuACK's raises at import as the DSL does without its toolkit. On a
    'GPU' (the availability check answers yes); the bench's timing process must not start unless a test says so."""
    site = tmp_path / "site"
    for path, text in {"rmsnorm.py": "def rmsnorm_fwd(*a, **k): raise AssertionError('stand-in')\n",
                       "quack/__init__.py": "", "quack/rmsnorm.py": f"raise RuntimeError({CTK!r})\n",
                       "liger_kernel/__init__.py": "", "liger_kernel/ops/__init__.py": "",
                       "liger_kernel/ops/rms_norm.py": "def rms_norm_forward(*a): raise AssertionError('stand-in')\n"
                       }.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    for name in [n for n in sys.modules if n in ("rmsnorm", "quack", "liger_kernel") or
                 n.startswith(("quack.", "liger_kernel."))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr("kernel_factory.evo.evaluate.gpu.gpu_unavailable_reason", lambda: None)
    spawned = []
    monkeypatch.setattr(bench_process, "spawn", lambda job, target: spawned.append(job) or iter(()))
    return spawned


def timing_stand_in(monkeypatch, crash: dict[str, str] | None = None, dead: str | None = None,
                    never: str | None = None) -> list[dict]:
    """bench_process.spawn replaced by a process that 'times' every provider at a fresh random µs, crashes (once)
    where `crash` says (case -> provider), dies once at case `dead`, and never gets a time from provider `never`.
    It honours the job's skip as bench_case does. Returns the jobs it was given."""
    jobs, rng = [], random.Random()

    def spawn(job, target):
        jobs.append(json.loads(json.dumps(job)))
        yield ("start", {"copy_gbps": 4000.0, "flush_us": FLUSH_US,
                         "fingerprint": {"gpu": "TEST GPU", "date": "2026-12-03"}})
        for key in job["cases"]:
            skip = job["skip"].get(key, {})
            if crash and crash.get(key) and crash[key] not in skip:
                yield ("crashed", key, crash[key], CRASH)
                return
            if key == dead and "*" not in skip:
                yield ("died", -9)
                return
            dtype, dims = key.split(":")
            row = {"case": key, "dtype": dtype, "shape": [int(d) for d in dims.split("x")], "bytes": 1 << 20,
                   "providers": {}}
            if "*" in skip:
                row["crashed"] = skip["*"]
            else:
                for name in [SUBJECT, *job["baselines"], COPY]:
                    row["providers"][name] = ({"error": skip[name], "crashed": True} if name in skip else
                                              {"error": "failed: RuntimeError: no kernel"} if name == never else
                                              {"us": rng.uniform(5.0, 50.0), "pct_copy": rng.uniform(20, 90)})
            yield ("row", row)
        yield ("done", {"clocks_after": "sm 1980 MHz"})
    monkeypatch.setattr(bench_process, "spawn", spawn)
    return jobs


def best_ratio(row: dict, names) -> float | None:
    times = [row["providers"][n]["us"] for n in names if "us" in row["providers"].get(n, {})]
    mine = row["providers"].get(SUBJECT, {}).get("us")
    return min(times) / mine if times and mine else None


def test_a_peer_that_cannot_load_stops_bench_before_any_timing(fake_peers, tmp_path, capsys):
    assert cli.main(["bench", "--table", FWD, "--out", str(tmp_path / "out")]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "peers quack, quack_tuned cannot load here" in err and f"quack: RuntimeError: {CTK}" in err
    assert err.rstrip().endswith("--without quack,quack_tuned")
    assert fake_peers == [] and not (tmp_path / "out").exists()


def test_an_unknown_peer_to_leave_out_is_one_line(fake_peers, capsys):
    assert cli.main(["bench", "--table", FWD, "--without", "quak"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--without: rmsnorm_fwd has no peer 'quak'; its peers are int21, quack, quack_tuned" in err
    assert fake_peers == []


def test_without_is_in_the_headline_and_the_json(fake_peers, monkeypatch, tmp_path, capsys):
    jobs = timing_stand_in(monkeypatch)
    out = tmp_path / "out"
    assert cli.main(["bench", "--table", FWD, "--shapes", "1024x4096,8x768", "--without", "quack,quack_tuned",
                     "--out", str(out)]) == 0
    (job,) = jobs
    assert job["baselines"] == ["int21", "liger", "torch_eager", "torch_compile"]
    result = json.loads((out / "bench.json").read_text())
    assert result["flush_us"] == FLUSH_US   # the timing process's flush time reaches the result (host marks need it)
    # not the benchmark rows: QuACK's tuned entry point does not belong here, so only QuACK is left out
    assert result["without"] == {"quack": "left out (--without)"} and "quack_tuned" not in result["declared"]
    assert result["ran"] == {"bfloat16": ["int21", "liger", "torch_eager", "torch_compile"]}
    md = (out / "bench.md").read_text()
    gm = bench_report.geomean([best_ratio(r, ["int21"]) for r in result["rows"]])
    assert f"Geomean of the ratios (without QuACK): vs best peer {gm:.3f};" in md
    assert "Best peer: the fastest of int21 in each row." in md
    assert "- bfloat16: QuACK (quack): left out (--without)" in md


def test_a_crash_on_one_row_is_recorded_and_the_bench_goes_on(fake_peers, monkeypatch, tmp_path, capsys):
    shapes = ["1024x4096", "32768x6144", "8x768"]
    crashed = "bfloat16:32768x6144"
    jobs = timing_stand_in(monkeypatch, crash={crashed: "int21"})
    out = tmp_path / "out"
    assert cli.main(["bench", "--table", FWD, "--shapes", ",".join(shapes), "--without", "quack",
                     "--out", str(out)]) == 0
    assert [j["cases"][0] for j in jobs] == ["bfloat16:1024x4096", crashed]   # a fresh process from the crash on
    assert jobs[1]["skip"] == {crashed: {"int21": CRASH}}
    result = json.loads((out / "bench.json").read_text())
    assert [r["case"] for r in result["rows"]] == [f"bfloat16:{s}" for s in shapes] and "partial" not in result
    assert result["restarts"] == [{"case": crashed, "provider": "int21", "why": CRASH}]
    row = next(r for r in result["rows"] if r["case"] == crashed)
    assert row["providers"]["int21"] == {"error": CRASH, "crashed": True}
    assert "int21" in result["ran"]["bfloat16"]   # it ran on the other rows
    md = (out / "bench.md").read_text()
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    head = cells(next(l for l in md.splitlines() if l.startswith("| case ")))
    row = dict(zip(head, cells(next(l for l in md.splitlines() if l.startswith(f"| {crashed} ")))))
    assert row["vs int21"] == "crashed" and row["vs liger"] not in ("crashed", "-")
    assert "Geomean of the ratios (without QuACK; INT21 crashed on 1 row):" in md
    assert "- bfloat16: INT21 (int21): crashed on 1 row" in md


def test_a_process_that_dies_mid_row_marks_that_row_and_goes_on(fake_peers, monkeypatch, tmp_path):
    dead = "bfloat16:64x1024"
    jobs = timing_stand_in(monkeypatch, dead=dead)
    assert cli.main(["bench", "--table", FWD, "--shapes", "8x768,64x1024,4x512", "--without", "quack",
                     "--out", str(tmp_path)]) == 0
    assert len(jobs) == 2 and jobs[1]["skip"] == {dead: {"*": "crashed: the bench process died (exit code -9)"}}
    result = json.loads((tmp_path / "bench.json").read_text())
    assert [r.get("crashed") for r in result["rows"]] == [None, "crashed: the bench process died (exit code -9)",
                                                          None]
    assert f"| {dead} | CRASHED: crashed: the bench process died" in (tmp_path / "bench.md").read_text()


def test_a_peer_that_runs_on_no_row_fails_the_command_after_the_report(fake_peers, monkeypatch, tmp_path, capsys):
    timing_stand_in(monkeypatch, never="liger")
    assert cli.main(["bench", "--table", FWD, "--shapes", "8x768,64x1024", "--without", "quack",
                     "--out", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "peer liger ran on no row (liger on bfloat16: failed: RuntimeError: no kernel)" in err
    assert "--without liger" in err
    md = (tmp_path / "bench.md").read_text()   # written all the same
    assert "Geomean of the ratios (without QuACK, Liger):" in md


def campaign(tmp_path: Path, keys: list[str]) -> Path:
    folder = tmp_path / "campaign"
    (folder / "kernels").mkdir(parents=True)
    shutil.copy(FWD, folder / "kernels" / "dispatch.json")
    (folder / "workload.json").write_text(json.dumps({"config": {"problem": "rmsnorm_fwd"}, "heldout": keys}))
    return folder


def test_heldout_stops_before_timing_when_a_peer_cannot_load(fake_peers, tmp_path, capsys):
    folder = campaign(tmp_path, ["bfloat16:1x4096"])
    assert cli.main(["heldout", str(folder)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    # QuACK's tuned entry point is not a held-out peer: only QuACK is named
    assert "peer quack cannot load here" in err and CTK in err and err.rstrip().endswith("--without quack")
    assert fake_peers == [] and not (folder / "heldout-bench.json").exists()


def test_heldout_lines_say_without_and_crashed(fake_peers, monkeypatch, tmp_path, capsys):
    keys = ["bfloat16:1x4096", "bfloat16:32768x6144", "bfloat16:7x1000", "float32:5x3000"]
    timing_stand_in(monkeypatch, crash={"bfloat16:32768x6144": "int21"})
    folder = campaign(tmp_path, keys)
    assert cli.main(["heldout", str(folder), "--without", "quack"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads((folder / "heldout-bench.json").read_text())
    ran = ["int21", "liger", "torch_eager", "torch_compile"]
    want = []
    for dtype, short, note in (("bfloat16", "bf16", "without QuACK; INT21 crashed on 1 row"),
                               ("float32", "fp32", "without QuACK")):
        ratios = [(best_ratio(r, ran), "x".join(map(str, r["shape"]))) for p in result["parts"] for r in p["rows"]
                  if r["dtype"] == dtype]
        gm = math.exp(sum(math.log(v) for v, _ in ratios) / len(ratios))
        worst = min(ratios)
        want.append(f"held-out fwd {short}: geomean {gm:.2f}x best peer over {len(ratios)} shapes ({note}), "
                    f"worst {worst[0]:.2f}x at {worst[1]}")
    for dtype, short, note in (("bfloat16", "bf16", "without QuACK; INT21 crashed on 1 row"),
                               ("float32", "fp32", "without QuACK")):   # the op as shipped: timed, never a peer
        rows = [r for p in result["parts"] for r in p["rows"] if r["dtype"] == dtype]
        as_op = sorted((best_ratio({"providers": {**r["providers"], SUBJECT: r["providers"]["factory_op"]}}, ran),
                        "x".join(map(str, r["shape"]))) for r in rows)
        gm = math.exp(sum(math.log(v) for v, _ in as_op) / len(as_op))
        want.append(f"held-out fwd {short}, op as shipped: geomean {gm:.2f}x best peer over {len(as_op)} shapes "
                    f"({note}), worst {as_op[0][0]:.2f}x at {as_op[0][1]}")
        ratios = sorted((r["providers"]["factory_op"]["us"] / r["providers"]["factory"]["us"],
                         "x".join(map(str, r["shape"]))) for r in rows)
        gm = math.exp(sum(math.log(v) for v, _ in ratios) / len(ratios))
        want.append(f"against the shipped op fwd {short}: geomean {gm:.2f}x over {len(ratios)} shapes, worst "
                    f"{ratios[0][0]:.2f}x at {ratios[0][1]}")
    assert out == want
    md = (folder / "heldout.md").read_text()
    assert f"- `{want[0]}`" in md and "| bf16 | 32768x6144 |" in md and "int21 crashed: crashed:" in md
    assert {p["without"]["quack"] for p in result["parts"]} == {"left out (--without)"}
    capsys.readouterr()
    assert cli.main(["heldout", str(folder), "--from", str(folder / "heldout-bench.json"), "--out",
                     str(tmp_path / "again")]) == 0
    assert capsys.readouterr().out.strip().splitlines() == want   # re-rendered from the JSON: the same report
    assert (tmp_path / "again/heldout.md").read_text() == md
    # as committed, xz-compressed: the same bench and the same report
    from kernel_factory.evo.tools import heldout
    packed = tmp_path / "heldout-bench.json.xz"
    heldout.write_bench(result, packed)
    assert packed.read_bytes()[:6] == b"\xfd7zXZ\x00" and heldout.read_bench(packed) == result
    assert cli.main(["heldout", str(folder), "--from", str(packed), "--out", str(tmp_path / "packed")]) == 0
    assert capsys.readouterr().out.strip().splitlines() == want
    assert (tmp_path / "packed/heldout.md").read_text() == md


def test_a_heldout_bench_cut_short_goes_on_with_only_the_cases_it_lacks(fake_peers, monkeypatch, tmp_path, capsys):
    """--go-on: a dtype the earlier bench finished is not timed again, a dtype it cut is timed on its missing cases
    only, and a dtype it never reached in full; every earlier row stays as measured, and the report is whole."""
    from kernel_factory.evo.tools import heldout
    keys = ["bfloat16:1x4096", "bfloat16:7x1000", "float16:9x2048", "float16:33x512", "float16:5x300",
            "float32:5x3000", "float32:2x128"]
    jobs = timing_stand_in(monkeypatch)
    folder = campaign(tmp_path, keys)
    assert cli.main(["heldout", str(folder), "--without", "quack"]) == 0
    whole = json.loads((folder / "heldout-bench.json").read_text())
    cut = json.loads(json.dumps(whole))   # as if stopped during fp16's third row: fp16 2 of 3, no fp32
    fp16 = next(p for p in cut["parts"] if peers.dtypes_of(p) == ["float16"])
    fp16["rows"], fp16["partial"] = fp16["rows"][:2], "2 of 3 cases"
    cut["parts"] = [p for p in cut["parts"] if peers.dtypes_of(p) != ["float32"]]
    heldout.write_bench(cut, folder / "heldout-bench.json.xz")   # as committed
    (folder / "heldout-bench.json").unlink()
    del jobs[:]
    capsys.readouterr()
    assert cli.main(["heldout", str(folder), "--without", "quack", "--go-on"]) == 0
    assert [j["cases"] for j in jobs] == [["float16:5x300"], ["float32:5x3000", "float32:2x128"]]
    result = json.loads((folder / "heldout-bench.json").read_text())
    rows = {p_["rows"][0]["dtype"]: p_ for p_ in result["parts"]}
    assert rows["bfloat16"] == next(p for p in cut["parts"] if peers.dtypes_of(p) == ["bfloat16"])
    assert rows["float16"]["rows"][:2] == fp16["rows"] and len(rows["float16"]["rows"]) == 3
    assert "partial" not in rows["float16"] and "partial" not in result and rows["float16"]["continued"]
    assert len(rows["float32"]["rows"]) == 2
    out = capsys.readouterr().out
    assert "cut short" not in out and "over 3 shapes" in out and "over 2 shapes" in out
    for bad in (["--go-on", "--from", str(folder / "heldout-bench.json")], ["--go-on"]):
        if bad == ["--go-on"]:
            (folder / "heldout-bench.json").unlink()
            (folder / "heldout-bench.json.xz").unlink()
        assert cli.main(["heldout", str(folder), *bad]) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "heldout --go-on" in err and "Traceback" not in err


def test_old_results_are_read_from_their_rows():
    """Benches recorded before results named their peers: the committed fp16/fp32 bench never asked for QuACK's
    tuned entry point, which its benchmark rows should have had; its report says so."""
    old = json.loads((ROOT / "docs/results/bench/fwd-fp16-fp32.json").read_text())
    assert "without" not in old
    md = bench_report.markdown(old)
    assert "Geomean of the ratios (without QuACK tuned): vs best peer" in md
    assert "Best peer: the fastest of quack, int21 in each row." in md
    acct = peers.account(old, "float16")
    assert acct.ran == ("int21", "quack", "liger", "torch_eager", "torch_compile")
    assert acct.without == {"quack_tuned": "not timed by this bench"} and acct.failed == {"liger": 2}


def gap_bench(path: Path, with_tuned: bool) -> Path:
    rng = random.Random()
    names = ["int21", "quack", *(["quack_tuned"] if with_tuned else []), "liger", "torch_eager", "torch_compile"]
    rows = [{"case": f"bfloat16:32768x{n}", "dtype": "bfloat16", "shape": [32768, n], "bytes": 32768 * n * 4,
             "providers": {name: {"us": rng.uniform(5, 50)} for name in [SUBJECT, *names]}} for n in (256, 4096)]
    path.write_text(json.dumps({"format": "kernel-factory-bench/1", "problem": "rmsnorm_fwd", "subject": "t",
                                "baselines": names, "peers": [n for n in names if n in ("quack", "quack_tuned",
                                                                                        "int21")],
                                "declared": ["int21", "quack", "quack_tuned", "liger", "torch_eager",
                                             "torch_compile"], "without": {} if with_tuned else
                                {"quack_tuned": "not asked for (--baselines)"},
                                "copy_gbps": 4000.0, "fingerprint": {"gpu": "NVIDIA H200", "date": "2026-12-03"},
                                "rows": rows}))
    return path


def test_gap_refuses_a_bench_that_lacks_a_published_peer(tmp_path, capsys):
    bench = gap_bench(tmp_path / "bench.json", with_tuned=False)
    report = {"name": "bf16", "bench": str(bench), "dtypes": ["bfloat16"], "geomean": 1.0, "floor": 0.9}
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump({"reports": [report]}))
    assert cli.main(["gap", str(targets), "--report-only"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bench} lacks peer quack_tuned" in err and "--without quack_tuned" in err
    assert cli.main(["gap", str(targets), "--report-only", "--without", "quack_tuned"]) == 0
    assert re.search(r"\*\*(not )?met\*\* \(without QuACK tuned\): geomean", capsys.readouterr().out)
    targets.write_text(yaml.safe_dump({"reports": [{**report, "without": ["quack_tuned"]}]}))
    (rep,) = gap.analyse(gap.load_targets(targets))["reports"]
    assert rep["note"] == "without QuACK tuned" and rep["peers"] == ["int21", "quack"]
    assert rep["without"] == {"quack_tuned": "not asked for (--baselines)"}
    assert "(without QuACK tuned)" in gap.markdown({"close": 0.05, "journals": {}, "reports": [rep]})
    full = gap_bench(tmp_path / "full.json", with_tuned=True)
    targets.write_text(yaml.safe_dump({"reports": [{**report, "bench": str(full)}]}))
    (rep,) = gap.analyse(gap.load_targets(targets))["reports"]
    assert rep["note"] == "" and rep["peers"] == ["int21", "quack", "quack_tuned"]


def test_a_suite_checks_every_parts_peers_before_timing_and_says_without(fake_peers, monkeypatch, tmp_path, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"parts": [
        {"problem": "rmsnorm_fwd", "table": FWD, "dtypes": ["bfloat16"], "shapes": "8x768",
         "baselines": ["int21", "torch_eager"]},
        {"problem": "rmsnorm_bwd", "table": str(ROOT / "kernels/ops/rmsnorm_bwd.json"), "dtypes": ["float16"],
         "shapes": "64x1024,8x4096"}]}))
    assert cli.main(["bench", "--suite", str(suite)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "bench suite part 1 (rmsnorm_bwd): rmsnorm_bwd: peer quack cannot load here" in err and fake_peers == []
    jobs = timing_stand_in(monkeypatch)
    assert cli.main(["bench", "--suite", str(suite), "--without", "quack", "--out", str(tmp_path / "out")]) == 0
    assert [j["baselines"] for j in jobs] == [["int21", "torch_eager"],
                                             ["int21", "liger", "torch_eager", "torch_compile"]]
    md = (tmp_path / "out/bench.md").read_text()
    summary = [line.split(" | ")[-1] for line in md.splitlines() if line.startswith(("| 0 ", "| 1 "))]
    assert summary == ["without QuACK, Liger, torch.compile |", "without QuACK |"]


def test_the_timing_process_is_real_and_speaks_plain_data():
    """The real child process (spawned: it rebuilds problem and subject from plain data) with a subject it must
    refuse: its one-line error crosses the pipe and is raised in the parent as the same error, on any machine."""
    from kernel_factory.evo.config import ConfigError
    job = {"problem": "rmsnorm_fwd", "subject": {"genes": json.dumps({"threads": 3})}, "cases": ["bfloat16:8x768"],
           "baselines": ["torch_eager"], "reps": 3, "repeat": 1, "graph_below_us": 30.0, "skip": {}}
    assert [m[0] for m in bench_process.spawn(job, bench.child_main)] == ["config_error"]
    with pytest.raises(ConfigError, match="threads=3 is not one"):
        bench_process.measure(job, {}, bench.child_main)


def test_every_declared_peer_is_a_baseline_of_its_problem():
    from kernel_factory.evo import registry
    from kernel_factory.evo.protocols import DeclaresPeers, PublishedPeers
    for name in registry.available("problem"):
        problem = registry.load("problem", name)
        declared = peers.declared(problem)
        assert declared and {p.baseline for p in declared} <= set(problem.baselines), name
        assert all(p.label and p.baseline != peers.OWN_OP for p in declared), name
        if isinstance(problem, DeclaresPeers) and isinstance(problem, PublishedPeers):
            assert set(problem.peers) <= {p.baseline for p in declared}, name   # the best peer is a timed one


def test_a_campaign_checks_its_held_out_peers_before_searching(fake_peers):
    from kernel_factory.evo import registry
    from kernel_factory.evo.config import ConfigError
    from kernel_factory.evo.tools import heldout
    problem = registry.load("problem", "rmsnorm_bwd")
    with pytest.raises(ConfigError, match=r"peer quack cannot load here .*-o 'workload.without=\[quack\]'"):
        heldout.check_peers(problem, ())
    heldout.check_peers(problem, ("quack",))   # the config says to go on without it
    with pytest.raises(ConfigError, match="config key 'workload.without': rmsnorm_bwd has no peer 'quac'"):
        heldout.check_peers(problem, ("quac",))
