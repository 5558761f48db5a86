"""NVRTC compiles rendered genomes to sm_90a cubins on a machine with no GPU; reports and cache work."""
import random

import pytest

from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler, parse_ptxas
from kernel_factory.evo.types import Candidate, Genome


def jobs_for(compiler, problem, genomes, dtype="bfloat16"):
    out = []
    for g in genomes:
        cand = Candidate(g)
        key = compiler.key(render.body(problem, g, dtype))
        out.append(CompileJob(key, render.render(problem, cand, dtype), f"{cand.id}.cu"))
    return out


@pytest.fixture
def compiler(tmp_path):
    c = Compiler(tmp_path / "cache", workers=2)
    yield c
    c.close()


def test_several_genomes_compile_with_ptxas_reports(compiler, rmsnorm):
    space = rmsnorm.space
    picks = random.Random(0).sample(list(space.enumerate()), 5)
    genomes = [Genome.of(space.defaults())] + [Genome.of(g) for g in picks]
    # every load flavour must be among them
    for load in ("plain", "nc", "nc_na", "cp_async"):
        genomes.append(Genome.of({**space.defaults(), "load": load, "unroll": 1}))
    outs = list(compiler.compile_many(jobs_for(compiler, rmsnorm, genomes)))
    assert len(outs) == len({j.key for j in jobs_for(compiler, rmsnorm, genomes)})
    for out in outs:
        assert out.error is None, out.error
        assert out.cubin[:4] == b"\x7fELF"
        assert out.info.registers and 8 < out.info.registers <= 255
        assert out.info.compile_s > 0 and not out.info.cached
    ring = [o for o in outs if o.info.shared_bytes >= 2 * 256 * 16]
    assert ring, "the cp.async genome must report its shared-memory ring"


def test_every_dtype_compiles(compiler, rmsnorm):
    g = Genome.of(rmsnorm.space.defaults())
    for dt in rmsnorm.dtypes:
        (out,) = compiler.compile_many(jobs_for(compiler, rmsnorm, [g], dt))
        assert out.error is None, out.error


def test_cache_hits_and_failures_are_values(compiler, rmsnorm, tmp_path):
    g = Genome.of(rmsnorm.space.defaults())
    (first,) = compiler.compile_many(jobs_for(compiler, rmsnorm, [g]))
    (second,) = compiler.compile_many(jobs_for(compiler, rmsnorm, [g]))
    assert not first.info.cached and second.info.cached and second.cubin == first.cubin
    broken = Genome.of(rmsnorm.space.defaults(), {"reduce": "this is not C++;\n"})
    (bad,) = compiler.compile_many(jobs_for(compiler, rmsnorm, [broken]))
    assert bad.cubin is None and "error" in bad.error and "\x00" not in bad.error
    (bad_again,) = compiler.compile_many(jobs_for(compiler, rmsnorm, [broken]))
    assert bad_again.info.cached and bad_again.error == bad.error


def test_cache_key_covers_genes_dtype_and_toolchain(compiler, rmsnorm):
    d = rmsnorm.space.defaults()
    k = lambda genes, dt="bfloat16": compiler.key(render.body(rmsnorm, Genome.of(genes), dt))
    assert k(d) == k(dict(d))
    assert k(d) != k({**d, "load": "plain"}) != k(d, "float16")
    from kernel_factory.evo.evaluate.compile import cache_key
    body = render.body(rmsnorm, Genome.of(d), "bfloat16")
    assert cache_key(body, "13.0") != cache_key(body, "13.1")


def test_parse_ptxas():
    log = ("ptxas info    : Function properties for k\nptxas         .     8 bytes stack frame, 4 bytes spill stores, "
           "4 bytes spill loads\nptxas info    : Used 56 registers, used 1 barriers, 12320 bytes smem\n")
    assert parse_ptxas(log) == {"registers": 56, "shared_bytes": 12320, "local_bytes": 8, "spill_stores": 4,
                                "spill_loads": 4}
