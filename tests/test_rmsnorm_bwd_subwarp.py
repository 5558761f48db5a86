"""The backward template's sub-warp rows on the CPU (rows_per_cta above threads / 32: 2, 4, 8 or 16 threads a row, a
warp holding 16 .. 2 rows): the rule admits them on every path it allows and names what it refuses, their launch
plans keep the partial rows within the scratch, NVRTC builds them in every dtype without spilling, and the row sum's
shuffles in the binary are the group's butterfly (offsets TPR/2 .. 1), not the warp's (16 .. 1).
tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py runs the same genomes through the correctness gate."""
import re

import pytest

from kernel_factory.evo.evaluate import render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler, parse_ptxas
from kernel_factory.evo.types import Candidate, Genome
from kernel_factory.problems import rmsnorm_bwd as mod

P = mod.problem
DEFAULT = P.space.defaults()
# Every TPR on the paths sub-warp rows take: registers with and without prefetch, both vector widths, shared-memory
# dw partials, streamed batches, a cp.async ring, both small-M plans, every load and store flavour, CTAs of 4 to 32
# warps (tests/gpu/test_rmsnorm_bwd_subwarp_gpu.py gates these genomes).
SUBWARP = {
    "tpr16": dict(threads=128, rows_per_cta=8, ctas_per_sm=4),
    "tpr16_1024": dict(threads=1024, rows_per_cta=64, ctas_per_sm=1, reg_vecs=1, prefetch=False, vec_bytes=8),
    "tpr8_vec8": dict(threads=128, rows_per_cta=16, ctas_per_sm=4, vec_bytes=8, load="nc_na", store="cs"),
    "tpr4": dict(threads=128, rows_per_cta=32, ctas_per_sm=4, reg_vecs=2, prefetch=False),
    "tpr2": dict(threads=128, rows_per_cta=64, ctas_per_sm=4, reg_vecs=1, load="plain"),
    "tpr16_smem_stream": dict(threads=512, rows_per_cta=32, ctas_per_sm=1, reg_vecs=1, dw_acc="smem",
                              prefetch=False, stream_batch=4),
    "tpr8_ring": dict(threads=256, rows_per_cta=32, ctas_per_sm=2, stages=2, prefetch=False),
    "tpr4_ring_direct": dict(threads=256, rows_per_cta=64, ctas_per_sm=2, reg_vecs=1, stages=3, prefetch=False,
                             small_m="direct"),
    "tpr2_grouped": dict(threads=128, rows_per_cta=64, ctas_per_sm=4, reg_vecs=2, prefetch=False, dw_acc="smem",
                         stream_batch=2, small_m="grouped"),
}
MS = (1, 3, 63, 65, 1001, 32768)
NS = (1, 2, 7, 33, 100, 128, 255, 256, 1000, 4100, 65537, 262144)


def genes(**kw):
    g = {**DEFAULT, **kw}
    assert P.space.why_infeasible(g) is None, (kw, P.space.why_infeasible(g))
    return g


def tpr(g) -> int:
    return int(g["threads"]) // int(g["rows_per_cta"])


def test_rule_admits_every_sub_warp_width():
    widths = {tpr(genes(**kw)) for kw in SUBWARP.values()}
    assert widths == set(mod.SUBWARP_TPR) == {2, 4, 8, 16}
    feasible = [g for g in P.space.enumerate() if tpr(g) < 32]
    assert {tpr(g) for g in feasible} == widths and {int(g["threads"]) for g in feasible} == {128, 256, 512, 1024}
    assert {g["small_m"] for g in feasible} == {"none", "direct", "grouped", "cols"} and {g["stages"] for g in feasible} > {0}
    assert all(g["reduce"] == "shfl" and g["cluster"] == 1 for g in feasible)


@pytest.mark.parametrize("kw, words", [
    (dict(threads=128, rows_per_cta=16, ctas_per_sm=4, reduce="smem"), "(one warp or less) sums with shuffles"),
    (dict(threads=512, rows_per_cta=64, ctas_per_sm=1, cluster=2), "needs rows_per_cta=1"),
    (dict(threads=128, rows_per_cta=64, ctas_per_sm=2), "persistent grid busy"),
    (dict(threads=128, rows_per_cta=64, ctas_per_sm=4, reg_vecs=8, prefetch=False), "registers"),
])
def test_rule_rejects_sub_warp_genomes_with_a_reason(kw, words):
    reason = P.space.why_infeasible({**DEFAULT, **kw})
    assert reason and words in reason, reason


def test_rule_names_rows_of_less_than_two_threads():
    """A thread a row (not a choice of the space today) is refused by name, should rows_per_cta ever reach it."""
    reason = P.space.rule({**DEFAULT, "threads": 128, "rows_per_cta": 128, "ctas_per_sm": 4})
    assert reason and "whole warps per row, or 2/4/8/16 threads per row" in reason, reason


def test_default_genome_and_warp_rows_keep_their_plans():
    """Sub-warp rows change no plan of a row of a warp or more: the partial rows of global plans stay slots x rows."""
    g = genes(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")
    p = mod.plan(g, 8192, 262144, "bfloat16")
    assert p.flags & mod.PLAN_DW_GLOBAL and p.partial_rows == p.slots * 8
    assert mod.static_smem(DEFAULT) == 4 * 2 * 256 // 32 == 64 and mod.static_smem(genes(**SUBWARP["tpr16"])) == 0


@pytest.mark.parametrize("name", SUBWARP)
@pytest.mark.parametrize("dtype", P.dtypes)
def test_sub_warp_plans_stay_within_the_scratch(name, dtype):
    g = genes(**SUBWARP[name])
    rows, threads = int(g["rows_per_cta"]), int(g["threads"])
    for m in MS:
        for n in NS:
            for aligned in (True, False):
                p, label = mod.plan(g, m, n, dtype, aligned), (name, dtype, m, n, aligned)
                assert 1 <= p.slots <= min(-(-m // rows), mod.SMS * int(g["ctas_per_sm"])), label
                assert p.partial_rows <= mod.scratch_rows(m, n), label
                if p.flags & mod.PLAN_DW_GLOBAL:   # a row per group that starts within M
                    assert p.partial_rows == min(p.slots * rows, m), label
                else:
                    assert p.partial_rows == p.slots and p.flags & mod.PLAN_DW_SMEM, label   # never all in registers
                own = mod.static_smem(g) + mod.SMEM_SLACK + p.shared_bytes
                assert own <= mod.MAX_SMEM_PER_CTA, label
                width = int(g["vec_bytes"]) // mod.DTYPE_BYTES[dtype] if p.flags & mod.PLAN_VECTOR else 1
                vecs = -(-(n // width) // tpr(g))
                by_warp = g["dw_acc"] == "regs" and vecs <= int(g["reg_vecs"])
                assert bool(p.flags & mod.PLAN_DW_WARP) == (by_warp and bool(p.flags & mod.PLAN_DW_SMEM)), label
                if p.flags & mod.PLAN_DW_SMEM:     # a region per row group (or per warp): TPR lanes of every slot
                    regions = threads // 32 if by_warp else rows
                    assert p.shared_bytes - mod.ring_bytes(g) == regions * vecs * width * tpr(g) * 4, label
                    assert int(g["ctas_per_sm"]) * (own + 1024) <= mod.SMEM_PER_SM, label
                assert threads == rows * tpr(g)


def test_tiny_rows_keep_their_partials_in_shared_memory():
    """The shapes sub-warp rows are for (N of a few hundred, M = 32768): where the register vectors cover the row, a
    shared region per warp (its groups added by shuffles), one partial row per CTA, no global adds."""
    seen = 0
    for name in ("tpr16", "tpr8_vec8", "tpr4", "tpr2"):
        g = genes(**SUBWARP[name])
        for dtype in P.dtypes:
            for n in (64, 100, 128, 256):
                width = int(g["vec_bytes"]) // mod.DTYPE_BYTES[dtype]
                if n % width or -(-(n // width) // tpr(g)) > int(g["reg_vecs"]):
                    continue
                seen += 1
                p = mod.plan(g, 32768, n, dtype)
                slots = min(-(-32768 // int(g["rows_per_cta"])), mod.SMS * 4)
                assert p.flags & mod.PLAN_DW_WARP and p.slots == slots and p.partial_rows == p.slots, (name, n)
                padded = -(-(n // width) // tpr(g)) * tpr(g) * width   # the row, in whole slots of the group
                assert p.shared_bytes == int(g["threads"]) // 32 * padded * 4, (name, dtype, n)
    assert seen >= 12
    p = mod.plan(genes(**SUBWARP["tpr2"]), 32768, 256, "bfloat16")   # 16 vectors a thread, one in registers
    assert not p.flags & mod.PLAN_DW_WARP and p.partial_rows == min(p.slots * 64, 32768)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(name, dtype) -> CompileOutput for every SUBWARP genome and its warp-per-row twin (threads / 32 rows)."""
    named = {name: genes(**kw) for name, kw in SUBWARP.items()}
    named["warp_twin"] = genes(threads=128, rows_per_cta=4, ctas_per_sm=4)
    compiler = Compiler(tmp_path_factory.mktemp("bwd-subwarp-cache"), workers=2)
    jobs, owner = [], {}
    try:
        for name, g in named.items():
            for dt in P.dtypes:
                key = compiler.key(render.body(P, Genome.of(g), dt))
                owner[key] = (name, dt)
                jobs.append(CompileJob(key, render.render(P, Candidate(Genome.of(g)), dt), f"{name}-{dt}.cu"))
        return {owner[o.key]: (named[owner[o.key][0]], o) for o in compiler.compile_many(jobs)}
    finally:
        compiler.close()


def bfly_offsets(cubin: bytes) -> list[int]:
    """The lane offsets of every SHFL.BFLY in the main kernel's SASS (immediate operands), in program order."""
    text = sass.disassemble(cubin)
    main = text[text.index("Function : rmsnorm_bwd\n"):] if "Function : rmsnorm_bwd\n" in text else text
    main = main.split("Function : rmsnorm_bwd_dw")[0]
    return [int(x, 16) for x in re.findall(r"SHFL\.BFLY\s+\S+,\s*\S+,\s*\S+,\s*(0x[0-9a-f]+),", main)]


@pytest.mark.parametrize("name", SUBWARP)
def test_sub_warp_genomes_compile_in_every_dtype_without_spilling(builds, name):
    for dt in P.dtypes:
        g, out = builds[name, dt]
        assert out.error is None, f"{name} {dt}:\n{out.error}"
        report = parse_ptxas(out.info.log.split("Compiling entry function 'rmsnorm_bwd_dw'")[0])
        assert report["spill_stores"] == report["local_bytes"] == 0, (name, dt, report)
        assert report["registers"] <= mod.register_limit(g), (name, dt, report)
        assert report.get("shared_bytes", 0) == mod.static_smem(g) == 0, (name, dt, report)
        ops = sass.opcodes(sass.disassemble(out.cubin))
        for prefix, present, why in P.expected_sass(g, dt):
            assert bool(sum(n for op, n in ops.items() if op.startswith(prefix))) == present, (name, dt, why)


@pytest.mark.parametrize("dtype", P.dtypes)
def test_sub_warp_row_sums_shuffle_within_their_group(builds, dtype):
    """Per instantiation of the row loop (vector and one-element paths), one butterfly of log2(TPR) steps at offsets
    TPR/2 .. 1: no row sum crosses into another row's lanes, and the warp-per-row twin keeps 16 .. 1. Offsets of TPR
    and above are the end's dw combine across a warp's groups (PLAN_DW_WARP), with dw_acc=regs only."""
    assert sorted(bfly_offsets(builds["warp_twin", dtype][1].cubin)) == sorted([16, 8, 4, 2, 1] * 2)
    for name in SUBWARP:
        g, out = builds[name, dtype]
        t = tpr(g)
        offsets = bfly_offsets(out.cubin)
        steps = [t >> i for i in range(1, t.bit_length())]   # TPR/2, ..., 1
        assert sorted(o for o in offsets if o < t) == sorted(steps * 2), (name, offsets)
        combine = {o for o in offsets if o >= t}
        across = {16 >> i for i in range(5) if 16 >> i >= t}   # 16, ..., TPR
        assert combine == (across if g["dw_acc"] == "regs" else set()), (name, offsets)
