"""GPU tests of the RMSNorm forward template's wide-row genes (run on an H200: pytest -m gpu --gpu
tests/gpu/test_rmsnorm_fwd_wide_gpu.py): about thirty genomes spanning stage, stage_copy, cluster and persistent go
through the live evaluator, so each passes its correctness gate on every correctness and held-out shape in all three
dtypes (M = 1, odd N, N below a warp, N = 262144 where the staged slice no longer fits and the kernel falls back) and
is timed on the large benchmark rows where the old template fell behind. The times are printed for the record."""
import pytest

from kernel_factory.evo.types import Candidate, Case, Genome, Status

pytestmark = pytest.mark.gpu

# The rows where the unstaged template re-reads x from DRAM (bf16), plus one fp32 and one fp16 case so that the gate
# covers every dtype (it checks correctness and held-out shapes for each dtype among the timed cases).
CASES = [Case((32768, 32768), "bfloat16"), Case((32768, 65536), "bfloat16"), Case((16384, 131072), "bfloat16"),
         Case((8192, 262144), "bfloat16"), Case((8192, 65536), "float32"), Case((32768, 256), "float16")]

GENOMES = {
    "default": {},
    "stage": dict(stage="smem"),
    "stage_nokeep": dict(stage="smem", keep_x=False),
    "stage_512_cs": dict(stage="smem", threads=512, store="cs"),
    "stage_vec8_plain": dict(stage="smem", vec_bytes=8, load="plain", unroll=4),
    "stage_rows4_warp": dict(stage="smem", threads=128, rows_per_cta=4),
    "bulk": dict(stage="smem", stage_copy="bulk"),
    "bulk_1024": dict(stage="smem", stage_copy="bulk", threads=1024, unroll=1),
    "bulk_rows2_nokeep": dict(stage="smem", stage_copy="bulk", rows_per_cta=2, keep_x=False, reduce="smem"),
    "cluster2": dict(cluster=2),
    "cluster4_512": dict(cluster=4, threads=512),
    "cluster8_1024": dict(cluster=8, threads=1024, unroll=1),
    "cluster2_stage": dict(cluster=2, stage="smem"),
    "cluster4_stage_precise": dict(cluster=4, stage="smem", threads=512, rsqrt="precise"),
    "cluster8_stage_nokeep": dict(cluster=8, stage="smem", keep_x=False, threads=1024, unroll=1),
    "cluster2_bulk": dict(cluster=2, stage="smem", stage_copy="bulk"),
    "cluster4_bulk_512": dict(cluster=4, stage="smem", stage_copy="bulk", threads=512),
    "cluster8_bulk_1024": dict(cluster=8, stage="smem", stage_copy="bulk", threads=1024, unroll=1),
    "cluster16_stage_512": dict(cluster=16, stage="smem", threads=512),
    "cluster16_bulk_256": dict(cluster=16, stage="smem", stage_copy="bulk", threads=256),
    "cluster4_reduce_smem_na": dict(cluster=4, reduce="smem", load="nc_na"),
    "cluster4_cp_async_ring": dict(cluster=4, load="cp_async", unroll=1),
    "persistent": dict(persistent=True),
    "persistent_cp_async_ring": dict(persistent=True, load="cp_async", unroll=1),
    "persistent_warp_rows": dict(persistent=True, threads=128, rows_per_cta=4),
    "persistent_reduce_smem": dict(persistent=True, reduce="smem", rows_per_cta=2),
    "persistent_stage": dict(persistent=True, stage="smem"),
    "persistent_stage_warp_rows": dict(persistent=True, stage="smem", threads=128, rows_per_cta=4),
    "persistent_stage_nokeep_vec8": dict(persistent=True, stage="smem", keep_x=False, vec_bytes=8),
    "persistent_bulk": dict(persistent=True, stage="smem", stage_copy="bulk"),
    "persistent_bulk_rows2_smem": dict(persistent=True, stage="smem", stage_copy="bulk", rows_per_cta=2,
                                       reduce="smem"),
    "persistent_bulk_512_nokeep": dict(persistent=True, stage="smem", stage_copy="bulk", threads=512, keep_x=False),
    "w_regs": dict(w_ahead="regs"),
    "w_regs_cluster2_stage": dict(w_ahead="regs", cluster=2, stage="smem"),
    "w_regs_bulk_rows2": dict(w_ahead="regs", stage="smem", stage_copy="bulk", rows_per_cta=2),
    "w_l2_bulk_512": dict(w_ahead="l2", stage="smem", stage_copy="bulk", threads=512),
    "w_l2_persistent": dict(w_ahead="l2", persistent=True),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """name -> EvalResult for every genome, evaluated together (compiled ahead on the CPU, gated, then timed)."""
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    cands = {}
    for name, genes in GENOMES.items():
        g = {**problem.space.defaults(), **genes}
        assert problem.space.why_infeasible(g) is None, (name, problem.space.why_infeasible(g))
        cands[name] = Candidate(Genome.of(g), operator="test")
    ev = GpuEvaluator(problem, CASES, "torch_eager", 0, str(tmp_path_factory.mktemp("wide")), compile_workers=8)
    try:
        out = dict(zip(cands, ev.evaluate(list(cands.values()))))
    finally:
        ev.close()
    print("\n" + table(out))
    return out


def table(results) -> str:
    keys = [c.key for c in CASES]
    lines = ["genome".ljust(30) + "".join(k.split(":")[1].rjust(15) for k in keys) + "  status"]
    for name, res in results.items():
        times = "".join((f"{res.times_us[k]:.1f}" if k in res.times_us else "-").rjust(15) for k in keys)
        lines.append(name.ljust(30) + times + f"  {res.status.value} {res.message[:80]}")
    return "\n".join(lines)


def test_every_wide_genome_is_correct_and_timed(results):
    bad = {name: (res.status.value, res.message) for name, res in results.items() if res.status is not Status.OK}
    assert not bad, bad
    for name, res in results.items():
        assert set(res.times_us) == {c.key for c in CASES}, name
        assert not res.flags, (name, res.flags)
