"""GPU test of `kernel-factory bench` (run on an H200: pytest -m gpu --gpu tests/gpu/test_bench_gpu.py): one small
case of the default genome against torch eager, with the copy of the row's bytes timed beside them."""
from __future__ import annotations

import pytest

from kernel_factory.evo.tools import bench, bench_report

pytestmark = pytest.mark.gpu


def test_bench_times_the_subject_a_baseline_and_the_row_copy():
    result = bench.run("rmsnorm_fwd", {"genes": "{}"}, "256x4096", ["bfloat16"], ["torch_eager"], reps=5, repeat=1,
                       graph_below_us=30.0)
    (row,) = result["rows"]
    for name in (bench.SUBJECT, "torch_eager", bench.COPY):
        assert row["providers"][name]["us"] > 0, (name, row["providers"][name])
    assert "% row copy" in bench_report.markdown(result)
