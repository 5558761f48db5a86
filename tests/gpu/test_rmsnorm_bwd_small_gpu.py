"""GPU tests of the backward's small-M plans (gene small_m; run on an H200:
pytest -m gpu --gpu tests/gpu/test_rmsnorm_bwd_small_gpu.py).

Genomes with small_m=direct (one launch that writes dw itself where M is small) and small_m=grouped (slots of several
rows, fewer partial rows) in CTAs and clusters, with dw in registers, shared or global memory, must pass the worker's
correctness gate (fresh inputs, stale and poisoned outputs, a bitwise-repeated launch, planted special rows, canaries
around every output) at M on both sides of each plan's direct bound and N that take the vector and the one-element
paths, in all three dtypes."""
import random

import pytest

from test_rmsnorm_bwd_gpu import bench, build_changes, gate_shapes   # noqa: F401  (bench: a fixture)

pytestmark = pytest.mark.gpu

DTYPES = ("bfloat16", "float16", "float32")
MS = (1, 3, 64, 133, 1000)
NS = (7, 100, 1024, 4100, 5000, 8192, 65537)
SMALL = {
    "direct": dict(small_m="direct"),
    "grouped": dict(small_m="grouped"),
    "direct_warp_rows": dict(small_m="direct", threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1,
                             prefetch=False, dw_acc="smem"),
    "grouped_warp_rows": dict(small_m="grouped", threads=128, rows_per_cta=2, ctas_per_sm=4, reg_vecs=1, vec_bytes=8),
    "direct_c16_ring": dict(small_m="direct", threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2,
                            prefetch=False, dw_acc="smem"),
    "direct_c8_warps": dict(small_m="direct", threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem",
                            prefetch=False, cluster_sum="warps"),
    "grouped_c2": dict(small_m="grouped", threads=512, cluster=2, ctas_per_sm=1, reg_vecs=2, dw_acc="smem",
                       prefetch=False),
    "grouped_c4_stream": dict(small_m="grouped", threads=512, cluster=4, ctas_per_sm=1, reg_vecs=1, stream_batch=2),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (genes, {dtype: cubin})."""
    return build_changes(SMALL, tmp_path_factory.mktemp("bwd-small-cache"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_m_genomes_pass_the_gate(built, bench, dtype):
    from kernel_factory.problems import rmsnorm_bwd as mod
    shapes = [(m, n) for m in MS for n in NS]
    failures = gate_shapes(bench, built, dtype, shapes, random.Random(18))
    assert not failures, "\n".join(failures)
    # the one-launch plan really ran, on several genomes and shapes
    assert sum(mod.plan(g, m, n, dtype).launches == 1 for g, _ in built.values() for m, n in shapes) >= 20
