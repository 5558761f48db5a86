"""The compiled RMSNorm binaries contain the instructions their genes select (checked in SASS, no GPU needed).

This guards the template: a PTX choice that silently compiles to something else (e.g. an `#if` on a constexpr
that is always false) would make every measurement of that gene meaningless."""
import pytest

from kernel_factory.evo.evaluate import render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.types import Candidate, Genome


def sass_of(problem, **genes):
    cand = Candidate(Genome.of({**problem.space.defaults(), **genes}))
    out = compile_one(CompileJob("k", render.render(problem, cand, "bfloat16"), "k.cu"))
    assert out.error is None, out.error
    return sass.opcodes(sass.disassemble(out.cubin))


def has(ops, prefix):
    return sum(n for op, n in ops.items() if op.startswith(prefix))


@pytest.mark.parametrize("vec_bytes, width", [(16, "128"), (8, "64")])
def test_vector_width_reaches_the_binary(rmsnorm, vec_bytes, width):
    ops = sass_of(rmsnorm, vec_bytes=vec_bytes, load="nc", store="plain")
    assert has(ops, f"LDG.E.{width}.CONSTANT") and has(ops, f"STG.E.{width}")
    if vec_bytes == 16:
        assert not has(ops, "STG.E.64"), "16-byte genomes must not store in 8-byte pieces"


def test_load_and_store_flavours(rmsnorm):
    # the weight always takes the read-only path (LDG...CONSTANT); x's loads follow the gene
    plain, nc, nc_na = (sass_of(rmsnorm, load=v) for v in ("plain", "nc", "nc_na"))
    assert plain["LDG.E.128"] > 0 and nc["LDG.E.128"] == 0 and nc["LDG.E.128.CONSTANT"] > plain["LDG.E.128.CONSTANT"]
    assert nc_na["LDG.E.NA.128.CONSTANT"] > 0 and nc["LDG.E.NA.128.CONSTANT"] == 0
    assert has(sass_of(rmsnorm, load="cp_async"), "LDGSTS") and not has(nc, "LDGSTS")
    cs = sass_of(rmsnorm, store="cs")
    assert cs["STG.E.EF.128"] > 0 and cs["STG.E.128"] == 0 and nc["STG.E.EF.128"] == 0


def test_reduction_and_rsqrt(rmsnorm):
    shfl, smem = sass_of(rmsnorm, reduce="shfl"), sass_of(rmsnorm, reduce="smem")
    assert has(shfl, "SHFL.BFLY") >= 5 and not has(smem, "SHFL")
    # precise = IEEE sqrt then IEEE division: extra reciprocal refinements beyond the mean's division
    approx, precise = sass_of(rmsnorm, rsqrt="approx"), sass_of(rmsnorm, rsqrt="precise")
    assert approx["MUFU.RSQ"] > 0 and precise["MUFU.RCP"] > approx["MUFU.RCP"]


def test_staging_copies_reach_the_binary(rmsnorm):
    default = sass_of(rmsnorm)
    cp, bulk = sass_of(rmsnorm, stage="smem"), sass_of(rmsnorm, stage="smem", stage_copy="bulk")
    assert has(cp, "LDGSTS") and not has(default, "LDGSTS") and not has(bulk, "LDGSTS")
    assert cp["LDS.128"] > default["LDS.128"] and bulk["LDS.128"] > default["LDS.128"], "staged x read back 16 B"
    # TMA bulk copy, the mbarrier's expect-tx arrive and its phase-parity wait
    assert has(bulk, "UBLKCP") and has(bulk, "SYNCS.ARRIVE.TRANS64") and has(bulk, "SYNCS.PHASECHK.TRANS64")
    assert not has(cp, "UBLKCP") and not has(default, "UBLKCP") and not has(default, "SYNCS")


def test_cluster_reduction_reaches_the_binary(rmsnorm):
    default, cluster = sass_of(rmsnorm), sass_of(rmsnorm, cluster=4)
    # barrier.cluster arrive/wait (start, and around the exchange) and the DSMEM store: a generic ST.E into the
    # cluster's shared window (the template has no other generic store)
    assert has(cluster, "UCGABAR_ARV") >= 2 and has(cluster, "UCGABAR_WAIT") >= 2 and cluster["ST.E"] > 0
    assert not has(default, "UCGABAR") and default["ST.E"] == 0


def test_persistent_staging_prefetches_the_next_row(rmsnorm):
    once, persistent = sass_of(rmsnorm, stage="smem"), sass_of(rmsnorm, stage="smem", persistent=True)
    assert persistent["LDGDEPBAR"] > once["LDGDEPBAR"], "a second cp.async group: the next row's copies"


def test_expected_sass_holds_on_a_sample_of_the_space(rmsnorm):
    """The facts the GPU evaluator checks for every candidate (problem.expected_sass) hold on real binaries, so a
    flag on the GPU means the binary really contradicts its genes."""
    import random
    import re
    space = list(rmsnorm.space.enumerate())
    for genes in random.Random(11).sample(space, 6) + [rmsnorm.space.defaults()]:
        ops = sass_of(rmsnorm, **genes)
        for pattern, present, why in rmsnorm.expected_sass(genes, "bfloat16"):
            found = sum(n for op, n in ops.items() if re.match(pattern, op))
            assert bool(found) == present, (genes, pattern, why)


def test_weights_ahead_reach_the_binary():
    """w_ahead: l2 leaves L2 prefetches (CCTL.E.PF2) and nothing else does; regs moves the kept vectors' weight loads
    (the read-only LDG...CONSTANT: with load=plain, x takes plain LDGs) before the row's reduction, where the default
    issues them after it. Counted on the vector path, whose reduction is the binary's last butterfly group."""
    from kernel_factory.problems.rmsnorm_fwd import problem

    def order(dtype, **genes):
        cand = Candidate(Genome.of({**problem.space.defaults(), "load": "plain", **genes}))
        out = compile_one(CompileJob("k", render.render(problem, cand, dtype), "k.cu"))
        assert out.error is None, out.error
        ops = [m.group(1) for m in sass.OPCODE.finditer(sass.disassemble(out.cubin))]
        shfl = [i for i, op in enumerate(ops) if op.startswith("SHFL.BFLY")]
        vector_sum = shfl[len(shfl) // 2]   # the scalar path's butterflies come first, the vector path's next
        weights = [i for i, op in enumerate(ops) if op == "LDG.E.128.CONSTANT"]
        return sum(i < vector_sum for i in weights), ops.count("CCTL.E.PF2")

    for dtype, kept_loads in (("bfloat16", 16), ("float32", 8)):   # 8 kept vectors: 64 or 32 fp32 weights
        none, regs, l2 = order(dtype), order(dtype, w_ahead="regs"), order(dtype, w_ahead="l2")
        assert none == (0, 0) and l2[0] == 0 and l2[1] > 0, (dtype, none, l2)
        assert regs == (kept_loads, 0), (dtype, regs)
