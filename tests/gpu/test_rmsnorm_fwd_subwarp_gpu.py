"""GPU test of the forward template's sub-warp rows (run on an H200: pytest -m gpu --gpu
tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py): genomes of every TPR below a warp (2, 4, 8, 16), with tail=scalar and
tail=peel, and sub-warp rows on the other unstaged paths (vec8, the cp.async ring, the shared-memory tree, persistent)
go through the project's correctness gate (fresh random inputs, outputs poisoned with NaN and fenced by canaries, a
second call on the same buffers, a bitwise repeat, adversarial rows) in all three dtypes, at tiny and odd widths and
at M from 1 to 32771 (M never a multiple of rows_per_cta but once: the last CTA holds fewer rows than it has row
groups). Nothing is timed here; tests/gpu/subwarp_times.py prints the timings."""
from __future__ import annotations

import itertools

import pytest

from kernel_factory.evo.types import Case
from kernel_factory.problems.rmsnorm_fwd import SUBWARP_TPR, problem
from test_rmsnorm_fwd_tail_gpu import check, load_modules, runner

pytestmark = pytest.mark.gpu

WIDTHS = (1, 2, 7, 33, 100, 128, 255, 256, 257, 1000)
SHAPES = (tuple(itertools.product((1, 3, 133), WIDTHS))
          + ((32768, 100), (32771, 1), (32771, 7), (32771, 128), (32771, 255), (32771, 256), (32771, 1000)))

# Every TPR below a warp, with 256 threads, both tails; then the other unstaged paths with sub-warp rows.
GENOMES = {f"tpr{t}_{tail}": dict(threads=256, rows_per_cta=256 // t, tail=tail)
           for t in SUBWARP_TPR for tail in ("scalar", "peel")}
GENOMES.update({
    "tpr2_128_vec8_peel": dict(threads=128, rows_per_cta=64, vec_bytes=8, tail="peel"),
    "tpr4_nokeep_unroll4_vec8_cs": dict(threads=256, rows_per_cta=64, keep_x=False, unroll=4, vec_bytes=8,
                                        store="cs"),
    "tpr4_smem_reduce_peel": dict(threads=128, rows_per_cta=32, reduce="smem", tail="peel"),
    "tpr8_plain_precise": dict(threads=512, rows_per_cta=64, load="plain", rsqrt="precise"),
    "tpr8_persistent_peel": dict(threads=256, rows_per_cta=32, persistent=True, tail="peel"),
    "tpr16_1024_cp_async_peel": dict(threads=1024, rows_per_cta=64, load="cp_async", unroll=1, tail="peel"),
    "tpr16_persistent_ring": dict(threads=128, rows_per_cta=8, persistent=True, load="cp_async", unroll=1),
    "tpr2_persistent_smem_reduce": dict(threads=256, rows_per_cta=128, persistent=True, reduce="smem"),
})


def genes_of(name: str) -> dict:
    g = {**problem.space.defaults(), **GENOMES[name]}
    assert problem.space.why_infeasible(g) is None, (name, problem.space.why_infeasible(g))
    return g


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    return load_modules(tmp_path_factory.mktemp("cache"), {name: genes_of(name) for name in GENOMES})


@pytest.mark.parametrize("dtype", problem.dtypes)
@pytest.mark.parametrize("name", list(GENOMES))
def test_subwarp_genome_passes_the_gate(modules, name, dtype):
    genes, bad = genes_of(name), []
    assert any(m % genes["rows_per_cta"] for m, _ in SHAPES), "the last CTA must hold fewer rows in some case"
    for i, (m, n) in enumerate(SHAPES):
        case = Case((m, n), dtype)
        why = check(runner(modules[name, dtype], genes, case), case, i)
        if why:
            bad.append(why[:300])
    assert not bad, f"{name} {dtype}: {len(bad)} of {len(SHAPES)} cases failed:\n" + "\n".join(bad)
