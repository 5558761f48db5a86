"""GPU test of the backward template's sub-warp rows (run on an H200:
pytest -m gpu --gpu tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py).

Genomes of 2, 4, 8 and 16 threads a row (a warp holding 16 .. 2 rows), on every path the rule allows them (registers
with and without prefetch, dw partials per warp after the shuffle combine, per row group in shared memory and in
global memory, streamed batches, cp.async rings, small-M plans, 8- and 16-byte vectors), must pass the worker's
correctness gate (fresh inputs, stale and poisoned outputs, a bitwise-repeated launch, planted special rows, canaries
around every output) in all three dtypes at tiny and odd N (the vector path where N is a multiple of the vector, one
element at a time elsewhere, and N below one vector a thread) with M of 1, 3, 1001 (no multiple of any rows_per_cta:
the last CTA has idle row groups) and 32768, and at wide N where partials go to global memory with groups past M."""
import random

import pytest

from test_rmsnorm_bwd_gpu import bench, build_changes, gate_shapes   # noqa: F401  (bench: a fixture)
from test_rmsnorm_bwd_subwarp import SUBWARP            # the CPU test's genomes (tests/ is on the path there too)

pytestmark = pytest.mark.gpu

DTYPES = ("bfloat16", "float16", "float32")
NS = (1, 2, 7, 33, 64, 100, 128, 255, 256, 1000)
MS = (1, 3, 1001)
LARGE_M = ((32768, 100), (32768, 128), (32768, 256), (32771, 64))
WIDE = ((65, 20000), (3, 65537), (130, 4100))   # global partials (groups past M own none), streamed vectors


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (genes, {dtype: cubin})."""
    return build_changes(SUBWARP, tmp_path_factory.mktemp("bwd-subwarp-cache"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sub_warp_genomes_pass_the_gate(built, bench, dtype):
    from kernel_factory.problems import rmsnorm_bwd as mod
    shapes = [(m, n) for m in MS for n in NS] + list(LARGE_M) + list(WIDE)
    failures = gate_shapes(bench, built, dtype, shapes, random.Random(29))
    assert not failures, "\n".join(failures)
    # every placement of dw partials ran: per warp, per row group in shared memory, global
    paths = {mod.plan(g, m, n, dtype).flags & ~mod.PLAN_VECTOR for g, _ in built.values() for m, n in shapes}
    assert {mod.PLAN_DW_SMEM | mod.PLAN_DW_WARP, mod.PLAN_DW_SMEM, mod.PLAN_DW_GLOBAL} <= paths, paths
