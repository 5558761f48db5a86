"""The bench report on the CPU, from a synthetic bench result with known numbers: worst rows first, ratios and
geomeans, the repeat spread, unavailable and failing providers, CSV, PNG and the `--from` re-render."""
import json
import math
import random

from kernel_factory.evo.tools import bench_report, cli, exits
from kernel_factory.evo.tools.bench import SUBJECT


def result():
    def row(n, ours, eager, quack, repeat):
        return {"case": f"bfloat16:1024x{n}", "dtype": "bfloat16", "shape": [1024, n], "bytes": 4 * 1024 * n,
                "providers": {SUBJECT: {"us": ours, "iqr_us": 0.1, "gbps": 1.0, "pct_copy": 50.0, "graph": n < 512,
                                        "repeat_us": [repeat]},
                              "torch_eager": {"us": eager, "gbps": 1.0, "pct_copy": 40.0, "graph": n < 512,
                                              **({"note": "incorrect: dx off"} if n == 8192 else {})},
                              "quack": quack, "liger": {"error": "unavailable: liger-kernel is not installed"}}}
    return {"format": "kernel-factory-bench/1", "problem": "rmsnorm_fwd", "subject": "genome abc",
            "baselines": ["torch_eager", "quack", "liger"], "reps": 50, "repeat": 2, "graph_below_us": 30.0,
            "copy_gbps": 4200.0, "wall_s": 1.0, "fingerprint": {"gpu": "TEST GPU", "date": "2026-11-30T00:00:00"},
            "rows": [row(256, 10.0, 20.0, {"us": 12.0, "graph": True}, 10.1),        # 1.2x the best peer
                     row(4096, 50.0, 60.0, {"us": 40.0}, 50.5),       # 0.8x: the worst row
                     row(8192, 90.0, 100.0, {"error": "failed: too much shared memory"}, 90.0)]}


def test_worst_rows_first_and_ratios():
    r = result()
    order = [row["case"] for row in bench_report.worst_first(r)]
    assert order == ["bfloat16:1024x4096", "bfloat16:1024x8192", "bfloat16:1024x256"]
    assert bench_report.ratio(r["rows"][1], "quack") == 0.8
    gm = dict(bench_report.geomeans(r))
    assert math.isclose(gm["vs torch_eager"], (2.0 * 1.2 * (100 / 90)) ** (1 / 3))
    assert math.isclose(gm["vs best peer"], (1.2 * 0.8 * (100 / 90)) ** (1 / 3))
    assert gm["vs liger"] is None


def test_a_peer_timed_eagerly_beside_our_graph_replay_counts_only_where_it_is_faster_even_so():
    r = result()
    short = r["rows"][0]["providers"]
    short["quack"] = {"us": 12.0 + 30 * random.random(), "graph": False}   # host-bound: an upper bound
    short["torch_eager"]["graph"] = False
    assert bench_report.best_peer(r["rows"][0], ["torch_eager", "quack"]) is None
    assert bench_report.ratio(r["rows"][0], "quack") is None
    assert "'-' where a baseline timed eagerly" in bench_report.markdown(r)
    short["quack"]["us"] = 8.0   # faster even with its host path: it counts, against ours
    assert bench_report.best_peer(r["rows"][0], ["torch_eager", "quack"]) == ("quack", 8.0)
    assert bench_report.ratio(r["rows"][0], "quack") == 0.8
    r["rows"][1]["providers"]["quack"]["graph"] = True   # ours eager, the peer a replay: always stands
    assert bench_report.ratio(r["rows"][1], "quack") == 0.8


def test_markdown_says_what_happened():
    md = bench_report.markdown(result())
    lines = md.splitlines()
    table = [l for l in lines if l.startswith("| bfloat16")]
    assert table[0].startswith("| bfloat16:1024x4096") and "fails" in table[1] and "n/a" in table[0]
    assert "10.0 g" in table[2]   # the short row was graph-timed
    assert "at most 1.00% per row (worst bfloat16:1024x4096" in md
    assert "TEST GPU" in md and "too much shared memory" in md
    assert "1.111 *" in table[1] and "bfloat16:1024x8192 torch_eager: incorrect: dx off" in md


def test_a_copy_timed_per_row_adds_the_row_roofline_column():
    r = result()
    r["rows"][1]["providers"]["copy"] = {"us": 40.0}
    md = bench_report.markdown(r)
    assert "| case | ours µs | GB/s | % copy | % row copy | best peer |" in md
    row = next(l for l in md.splitlines() if l.startswith("| bfloat16:1024x4096"))
    assert row.split(" | ")[4] == "80%"      # 40 µs copy / 50 µs ours
    assert "% row copy" not in bench_report.markdown(result())


def test_files_and_rerender(tmp_path, capsys):
    paths = bench_report.write(result(), tmp_path)
    assert paths["png"].stat().st_size > 1000
    csv_text = paths["csv"].read_text()
    assert csv_text.startswith("# {") and "bfloat16:1024x4096,bfloat16,1024,4096" in csv_text
    assert json.loads(paths["json"].read_text())["subject"] == "genome abc"
    assert cli.main(["bench", "--from", str(paths["json"])]) == 0
    out = capsys.readouterr().out
    assert "re-rendered from" in out and "nothing was timed now" in out


def test_bench_without_gpu_is_one_clear_line(capsys):
    assert cli.main(["bench", "--genes", "{}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--from" in err


def test_best_peer_is_the_fastest_published_peer(tmp_path, capsys):
    """With peers recorded, torch eager (faster than QuACK in the 8192 row) no longer defines the best peer; a
    recording without them takes the problem's published peers on re-render."""
    r = result()
    r["rows"][2]["providers"]["quack"] = {"us": 105.0, "gbps": 1.0, "pct_copy": 45.0, "graph": False}
    assert bench_report.best_peer(r["rows"][2], bench_report.peer_set(r)) == ("torch_eager", 100.0)
    r["peers"] = ["quack"]
    assert bench_report.best_peer(r["rows"][2], bench_report.peer_set(r)) == ("quack", 105.0)
    assert dict(bench_report.geomeans(r))["vs best peer"] == dict(bench_report.geomeans(r))["vs quack"]
    assert "Best peer: the fastest of quack in each row" in bench_report.markdown(r)
    del r["peers"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(r))
    assert cli.main(["bench", "--from", str(path)]) == 0
    assert "Best peer: the fastest of quack in each row" in capsys.readouterr().out   # rmsnorm_fwd's peers


def test_a_bench_stopped_by_sigterm_keeps_the_cases_it_measured(tmp_path, monkeypatch, capsys):
    """`timeout` sends SIGTERM: the report of the cases measured so far is written, and the exit is non-zero. The
    JSON is also rewritten after every case, so that even a bench killed outright leaves its rows."""
    import os
    import signal
    import time
    from kernel_factory.evo.tools import bench
    full, seen = result(), []
    before = signal.getsignal(signal.SIGTERM)

    def fake_run(*args, on_row, **kw):
        for k in (1, 2):
            on_row({**full, "rows": full["rows"][:k], "partial": f"{k} of 3 cases"})
            seen.append(len(json.loads((tmp_path / "b.json").read_text())["rows"]))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the bench")
    monkeypatch.setattr(bench, "run", fake_run)
    assert cli.main(["bench", "--table", "t.json", "--out", str(tmp_path), "--stem", "b"]) == exits.EXIT_TERMINATED
    assert seen == [1, 2]
    err = capsys.readouterr().err
    assert "interrupted; the report covers what was measured (2 of 3 cases)" in err
    md = (tmp_path / "b.md").read_text()
    assert "**Partial**: the bench was stopped after 2 of 3 cases" in md
    assert [l.split(" |")[0] for l in md.splitlines() if l.startswith("| bfloat16")] == \
        ["| bfloat16:1024x4096", "| bfloat16:1024x256"]
    assert len(json.loads((tmp_path / "b.json").read_text())["rows"]) == 2 and (tmp_path / "b.png").is_file()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_bench_stopped_before_its_first_case_writes_nothing(tmp_path, monkeypatch, capsys):
    from kernel_factory.evo.tools import bench

    def fake_run(*args, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "run", fake_run)
    assert cli.main(["bench", "--table", "t.json", "--out", str(tmp_path)]) == exits.EXIT_INTERRUPTED
    assert "before its first case was measured; nothing written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_on_a_row_with_any_short_launch_every_provider_is_captured_where_it_can_be():
    from types import SimpleNamespace
    from kernel_factory.evo.tools import bench
    estimates = {"ours": 6.0, "peer_autograd": 160.0 + random.random(), "uncapturable": 5.0}
    timer = SimpleNamespace(policy=SimpleNamespace(graph_below_us=30.0), estimate_us=lambda fn: estimates[fn],
                            graphed=lambda fns: None if fns[0] == "uncapturable" else [f"replay of {fns[0]}"])
    out, graphed = bench.graph_where_short(timer, {k: k for k in estimates})
    # the peer whose host path outlasts the threshold is captured too: its kernel, not its host path, is timed
    assert graphed == {"ours", "peer_autograd"} and out["peer_autograd"] == "replay of peer_autograd"
    assert out["uncapturable"] == "uncapturable"
    estimates.update(ours=90.0, uncapturable=120.0)
    assert bench.graph_where_short(timer, {k: k for k in estimates}) == ({k: k for k in estimates}, set())


def test_a_time_with_the_host_path_inside_or_spread_wide_is_marked_and_counted():
    r = result()
    flush = random.uniform(40.0, 80.0)
    r["flush_us"] = flush
    slow = r["rows"][1]["providers"]
    slow["quack"].update(host_us=flush + random.uniform(1.0, 50.0), graph=False)   # the GPU waited on the host
    slow[SUBJECT]["host_us"] = flush - 1.0   # enqueued within the flush: nothing leaks
    slow["torch_eager"].update(iqr_us=0.5 * slow["torch_eager"]["us"])   # samples spread wide
    md = bench_report.markdown(r)
    row = next(l for l in md.splitlines() if l.startswith("| bfloat16:1024x4096"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "50.0"   # ours: no mark
    assert "0.800 h" in row and "1.200 ~" in row
    entries = sum(1 for x in r["rows"] for n, p in x["providers"].items() if "us" in p)
    assert f"flush's {flush:.1f} µs" in md and f"1 of {entries} times; ~" in md
    # a graph replay has no host path inside, whatever its host time
    slow["quack"]["graph"] = True
    assert "0.800 h" not in bench_report.markdown(r)
    # a result from before the bench recorded host times has no marks and no legend
    assert "Marks:" not in bench_report.markdown(result())
    # a row timed while the allocator had to free its cache and retry is named under the legend
    r["rows"][2].update(alloc_retries=7, gpu_free_gib=0.8)
    assert "- bfloat16:1024x8192: the allocator retried 7 cudaMalloc(s) while timing (0.8 GiB free at the start)" \
        in bench_report.markdown(r)
