"""GPU tests of `kernel-factory bench` (run on an H200: pytest -m gpu --gpu tests/gpu/test_bench_gpu.py): one small
case of the default genome against torch eager, with the copy of the row's bytes timed beside them; and a peer that
poisons the CUDA context on one row costs that row's peer only (the bench goes on in a fresh process)."""
from __future__ import annotations

import sys

import pytest

from kernel_factory.evo.tools import bench, bench_report

pytestmark = pytest.mark.gpu

# A stand-in for INT21's module: a correct forward, except at N = 2048, where an index past the end of a CUDA
# tensor trips a device-side assert, a sticky error after which nothing more runs in that process.
CRASHING_INT21 = '''
import torch


def rmsnorm_fwd(x, w, eps=1e-6, **kw):
    if x.shape[1] == 2048:
        torch.zeros(4, device=x.device)[torch.full((1,), 1 << 20, device=x.device)].sum().item()
    xf = x.float()
    return ((xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w).to(x.dtype),)
'''


def test_bench_times_the_subject_a_baseline_and_the_row_copy():
    result = bench.run("rmsnorm_fwd", {"genes": "{}"}, "256x4096", ["bfloat16"], ["torch_eager"], reps=5, repeat=1,
                       graph_below_us=30.0)
    (row,) = result["rows"]
    for name in (bench.SUBJECT, "torch_eager", bench.COPY):
        assert row["providers"][name]["us"] > 0, (name, row["providers"][name])
    assert "% row copy" in bench_report.markdown(result)


def test_a_peer_that_crashes_on_one_row_costs_that_row_only(tmp_path, monkeypatch):
    (tmp_path / "rmsnorm.py").write_text(CRASHING_INT21)
    monkeypatch.syspath_prepend(str(tmp_path))   # the bench's child processes get this sys.path too
    monkeypatch.delitem(sys.modules, "rmsnorm", raising=False)
    result = bench.run("rmsnorm_fwd", {"genes": "{}"}, "256x1024,256x2048,256x4096", ["bfloat16"],
                       ["int21", "torch_eager"], reps=5, repeat=1, graph_below_us=30.0)
    rows = {r["case"]: r for r in result["rows"]}
    assert list(rows) == ["bfloat16:256x1024", "bfloat16:256x2048", "bfloat16:256x4096"]
    crashed = rows["bfloat16:256x2048"]["providers"]["int21"]
    assert crashed.get("crashed") and crashed["error"].startswith("crashed"), crashed
    assert [r["case"] for r in result["restarts"]] == ["bfloat16:256x2048"]
    for key, row in rows.items():   # ours and torch eager on every row, INT21 wherever it did not crash
        for name in (bench.SUBJECT, "torch_eager", *(["int21"] if key != "bfloat16:256x2048" else [])):
            assert row["providers"][name]["us"] > 0, (key, name, row["providers"][name])
    assert "INT21 crashed on 1 row" in bench_report.markdown(result)
