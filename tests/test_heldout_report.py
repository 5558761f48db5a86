"""The held-out report of a workload campaign, on the CPU: each line against the best correct peer that can stand
against ours, the op as shipped timed beside the table, a bench cut short, and the re-render of a recorded bench."""
from __future__ import annotations

import json
import math
import random

from kernel_factory.evo.types import Case


def _row(dtype, shape, ours, **peers):
    providers = {"factory": {"us": ours, "pct_copy": 50.0}}
    for name, value in peers.items():
        providers[name] = value if isinstance(value, dict) else {"us": value}
    return {"case": f"{dtype}:{shape[0]}x{shape[1]}", "dtype": dtype, "shape": list(shape), "providers": providers}


def test_heldout_lines_compare_with_the_best_correct_peer():
    from kernel_factory.evo.tools import heldout
    result = {"format": "kernel-factory-bench/1", "rows": [
        _row("bfloat16", (1, 4096), 10.0, int21=8.0, liger=12.0),                      # 0.80 against int21
        _row("bfloat16", (4096, 4100), 20.0, int21={"us": 10.0, "note": "incorrect: 3% off"}, liger=25.0),
        _row("bfloat16", (7, 100), 5.0, int21={"error": "needs N % 8 == 0"}, torch_eager=6.0),
        _row("float32", (64, 64), 4.0, int21=4.4)]}
    lines, md = heldout.summarize(result, "rmsnorm_fwd")
    ratios = [0.8, 25 / 20, 6 / 5]
    geo = math.exp(sum(map(math.log, ratios)) / 3)
    # a result from before benches recorded their peers: what ran is read from the rows, and the declared peers
    # that did not run on a dtype's rows are named in its line
    assert lines == [f"held-out fwd bf16: geomean {geo:.2f}x best peer over 3 shapes (without QuACK, torch.compile), "
                     "worst 0.80x at 1x4096",
                     "held-out fwd fp32: geomean 1.10x best peer over 1 shapes (without QuACK, Liger, torch eager, "
                     "torch.compile), worst 1.10x at 64x64"]
    assert "int21 left out: incorrect: 3% off" in md and "int21 failed: needs N % 8 == 0" in md


def test_heldout_times_the_shipped_op_beside_the_table_and_says_how_they_compare(tmp_path, monkeypatch):
    from kernel_factory.evo.tools import bench, heldout
    asked = []

    def fake_run(problem, subject, shapes, dtypes, baselines, *args, **kwargs):
        asked.append((subject, baselines))
        return {"format": "kernel-factory-bench/1", "rows": [], "baselines": baselines}
    monkeypatch.setattr(bench, "run", fake_run)
    cases = [Case.parse("bfloat16:7x300"), Case.parse("float32:9x500")]
    heldout.bench_heldout("rmsnorm_fwd", tmp_path / "dispatch.json", cases, tmp_path / "b.json")
    assert len(asked) == 2 and all(b[-1] == "factory_op" and "quack" in b and "quack_tuned" not in b
                                   for _, b in asked)
    m = random.uniform(1.5, 3.0)
    result = {"format": "kernel-factory-bench/1", "rows": [
        _row("bfloat16", (1, 4096), 10.0, int21=8.0, factory_op=10.0 * m),
        _row("bfloat16", (3, 5000), 20.0, int21=30.0, factory_op=10.0),
        _row("float16", (3, 5000), 20.0, int21=30.0)]}
    lines, md = heldout.summarize(result, "rmsnorm_fwd")
    # the op is never the best peer; its comparison is a line of its own, only where it was timed
    assert lines[0].startswith(f"held-out fwd bf16: geomean {math.sqrt(0.8 * 1.5):.2f}x best peer over 2 shapes")
    assert f"- `against the shipped op fwd bf16: geomean {math.sqrt(m / 2):.2f}x over 2 shapes, worst 0.50x at 3x5000`" in md
    assert "against the shipped op fwd fp16" not in md


def test_a_heldout_bench_cut_short_says_so_in_its_lines_and_its_report():
    from kernel_factory.evo.tools import heldout
    k = random.randint(2, 40)
    part = {"format": "kernel-factory-bench/1", "partial": f"{k} of 48 cases",
            "rows": [_row("float16", (3, 5000), 20.0, int21=30.0)]}
    lines, md = heldout.summarize({"format": "kernel-factory-bench-suite/1", "partial": "0 of 1 parts in full",
                                   "parts": [part]}, "rmsnorm_bwd")
    assert f"cut short: {k} of 48 cases benched" in lines[0] and "**Partial**: 0 of 1 parts in full" in md


def test_heldout_command_rerenders_a_recorded_bench(tmp_path, capsys):
    from kernel_factory.evo.tools import cli
    (tmp_path / "workload.json").write_text(json.dumps({"config": {"problem": "rmsnorm_fwd"}, "heldout": []}))
    bench_json = tmp_path / "b.json"
    bench_json.write_text(json.dumps({"format": "kernel-factory-bench/1",
                                      "rows": [_row("float16", (3, 300), 2.0, int21=3.0)]}))
    assert cli.main(["heldout", str(tmp_path), "--from", str(bench_json)]) == 0
    assert "held-out fwd fp16: geomean 1.50x best peer over 1 shapes" in capsys.readouterr().out
    assert cli.main(["heldout", str(tmp_path / "nowhere")]) == cli.EXIT_BAD_INPUT
    assert "not a workload campaign folder" in capsys.readouterr().err


def test_heldout_against_an_earlier_bench_writes_the_comparison(tmp_path, capsys):
    """--against: each row's ratio then and now, and each provider's time apart by its earlier host path (an eager
    torch.compile whose host path outlasted the flush got faster; its row within the flush did not)."""
    import lzma
    from kernel_factory.evo.tools import cli, rerender
    flush, host, fast = 85.0, random.uniform(100.0, 300.0), random.uniform(80.0, 99.0)
    def bench(compile_us: float) -> dict:
        return {"format": "kernel-factory-bench/1", "problem": "rmsnorm_fwd", "peers": ["int21"], "flush_us": flush,
                "rows": [_row("bfloat16", (4096, 4096), 40.0, int21=44.0,
                              torch_compile={"us": compile_us, "host_us": host}),
                         _row("bfloat16", (64, 4096), 8.0, int21=8.8, torch_compile={"us": 9.0, "host_us": 5.0})]}
    for name, compile_us in (("then", 60.0), ("now", 60.0 * fast / 100)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "workload.json").write_text(json.dumps({"config": {"problem": "rmsnorm_fwd"},
                                                                   "heldout": []}))
        (tmp_path / name / "heldout-bench.json.xz").write_bytes(lzma.compress(json.dumps(bench(compile_us)).encode()))
    now = tmp_path / "now"
    assert cli.main(["heldout", str(now), "--from", str(now / "heldout-bench.json.xz"), "--against",
                     str(tmp_path / "then"), "--out", str(now)]) == 0
    text = (now / "compared-then.md").read_text()
    assert "## Against then" in text and "2 rows in both: **0 regressions**" in text
    assert f"| torch_compile | {fast / 100:.3f} | 1 | 1.000 | 1 |" in text
    assert rerender._compared(now / "compared-then.md").render() == text   # the committed kind re-renders alike
    assert cli.main(["heldout", str(now), "--against", str(tmp_path / "then")]) == cli.EXIT_BAD_INPUT
    assert "--against goes with --from" in capsys.readouterr().err


def test_heldout_notes_the_times_a_ratio_stands_on_that_should_be_weighed():
    from kernel_factory.evo.tools import heldout
    flush = random.uniform(40.0, 80.0)
    host = flush + random.uniform(5.0, 60.0)
    rows = [_row("bfloat16", (22530, 768), 40.0, int21=39.0,
                 factory_op={"us": 200.0, "iqr_us": 20.0, "host_us": host}),      # the op's host path inside
            _row("bfloat16", (5018, 5120), 85.0, int21={"us": 60.0, "iqr_us": 30.0}),   # the peer's samples spread
            _row("bfloat16", (64, 64), 4.0, int21={"us": 4.4, "iqr_us": 0.1, "host_us": host, "graph": True}),
            _row("bfloat16", (3391, 8192), 74.0, int21=56.0, factory_op=158.0)]
    rows.append(_row("float32", (9659, 2048), 69.0, int21=71.0, factory_op={"us": 136.0, "kernels": {
        "kernel": "c1a55e4", "rule": "0e1a9b2"}}))   # the op's tuning kept another kernel, slower than the rule's
    rows.append(_row("float32", (4846, 4096), 29.0, int21=29.5, factory_op={"us": 44.0, "host_us": host, "kernels": {
        "kernel": "2ee5312", "rule": "b26e0c5"}}))   # slower, but with its host path inside: not the tuning's doing
    retries = random.randint(1, 400)
    rows[3].update(alloc_retries=retries, gpu_free_gib=1.5)   # another process held the GPU's memory
    result = {"format": "kernel-factory-bench/1", "flush_us": flush, "rows": rows}
    lines, md = heldout.summarize(result, "rmsnorm_fwd")
    assert "Rows with a time to weigh" in md and "bf16 3, fp32 2." in md
    assert f"the allocator retried {retries} cudaMalloc(s) while timing (1.5 GiB free at the start)" in md
    table = {line.split("|")[2].strip(): line for line in md.splitlines() if line.startswith("| bf16")}
    assert f"factory_op 200.0 µs with its host path inside (host {host:.1f} µs a call, flush {flush:.1f} µs)" \
        in table["22530x768"]
    assert "int21 60.0 µs noisy (IQR 50% of it)" in table["5018x5120"]
    assert "µs" not in table["64x64"].split("|")[7]   # a graph replay: its host time is outside the events
    fp32 = next(line for line in md.splitlines() if line.startswith("| fp32 | 9659x2048"))
    assert "the op's tuning kept c1a55e4, not the rule's 0e1a9b2, and ran 1.97x the table's time" in fp32
    hosted = next(line for line in md.splitlines() if line.startswith("| fp32 | 4846x4096"))
    assert "factory_op 44.0 µs with its host path inside" in hosted and "tuning kept" not in hosted
