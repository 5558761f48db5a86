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
