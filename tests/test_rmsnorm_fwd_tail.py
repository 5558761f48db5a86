"""The forward template's tail gene, on the CPU: tail=peel genomes across the space compile for every dtype and keep
their vector instructions, tail=scalar (the default, and every genome from before the gene) builds the very cubins
the dispatch table shipped, the gene never changes which genomes are feasible, and the launch stages rows of any N
with tail=peel. tests/gpu/test_rmsnorm_fwd_tail_gpu.py runs the same genomes through the correctness gate."""
import hashlib
import itertools
import json
import lzma
import random
import re
from pathlib import Path

import pytest

from kernel_factory.evo.evaluate import render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.types import Candidate, Genome
from kernel_factory.evo.protocols import recipe_names
from kernel_factory.problems import rmsnorm_fwd as rf

ROOT = Path(__file__).resolve().parents[1]
# The op's forward table before the tail gene (and before the workload campaign replaced it): its sha256 per kernel
TABLE = ROOT / "docs" / "results" / "workload" / "h200-fwd-workload" / "per-row-table.json.xz"

# Peel genomes over the paths of the template: registers and streaming, the cp.async ring, several rows per CTA,
# persistent, staged (cp.async and bulk, with the persistent prefetch) and clusters.
PEEL = {
    "default": {},
    "vec8_nokeep_unroll4": dict(vec_bytes=8, keep_x=False, unroll=4),
    "cp_async": dict(load="cp_async"),
    "cp_async_rows4": dict(load="cp_async", threads=128, rows_per_cta=4, unroll=1),
    "rows2_smem_reduce": dict(rows_per_cta=2, reduce="smem"),
    "persistent_rows4": dict(persistent=True, threads=128, rows_per_cta=4),
    "persistent_ring": dict(persistent=True, load="cp_async", unroll=1),
    "stage": dict(stage="smem"),
    "stage_bulk_rows2": dict(stage="smem", stage_copy="bulk", rows_per_cta=2),
    "persistent_stage_vec8": dict(persistent=True, stage="smem", vec_bytes=8),
    "persistent_bulk": dict(persistent=True, stage="smem", stage_copy="bulk"),
    "cluster2": dict(cluster=2),
    "cluster8_bulk": dict(cluster=8, stage="smem", stage_copy="bulk", threads=1024, keep_x=False),
    "cluster16_stage": dict(cluster=16, stage="smem", threads=512),
}


def genes(tail: str = "peel", **extra) -> dict:
    g = {**rf.problem.space.defaults(), **extra, "tail": tail}
    assert rf.problem.space.why_infeasible(g) is None, rf.problem.space.why_infeasible(g)
    return g


@pytest.fixture(scope="module")
def peel_builds(tmp_path_factory):
    """(name, dtype) -> CompileOutput for PEEL x dtypes, compiled once for the module."""
    compiler = Compiler(tmp_path_factory.mktemp("cache"), workers=2)
    jobs, names = [], []
    for (name, extra), dtype in itertools.product(PEEL.items(), rf.problem.dtypes):
        g = Genome.of(genes(**extra))
        jobs.append(CompileJob(compiler.key(render.body(rf.problem, g, dtype)),
                               render.render(rf.problem, Candidate(g), dtype), f"{name}-{dtype}.cu"))
        names.append((name, dtype))
    by_key = {out.key: out for out in compiler.compile_many(jobs)}
    compiler.close()
    return {n: by_key[j.key] for n, j in zip(names, jobs)}


@pytest.mark.parametrize("dtype", rf.problem.dtypes)
@pytest.mark.parametrize("name", list(PEEL))
def test_peel_genomes_compile_and_keep_their_vector_instructions(peel_builds, name, dtype):
    out = peel_builds[name, dtype]
    assert out.cubin is not None and out.cubin[:4] == b"\x7fELF", out.error
    ops = sass.opcodes(sass.disassemble(out.cubin))
    g = genes(**PEEL[name])
    for pattern, present, why in rf.problem.expected_sass(g, dtype):
        assert bool(sum(n for op, n in ops.items() if re.match(pattern, op))) == present, (name, pattern, why)


def test_peel_changes_the_source_and_scalar_is_the_default():
    assert rf.problem.space["tail"].default == "scalar"
    peel = render.body(rf.problem, Genome.of(genes()), "bfloat16")
    scalar = render.body(rf.problem, Genome.of(genes("scalar")), "bfloat16")
    assert "#define TAIL TAIL_PEEL\n" in peel and "#define TAIL TAIL_SCALAR\n" in scalar


@pytest.fixture(scope="module")
def shipped_rebuilds(tmp_path_factory):
    """A sample of the shipped table's kernels (built from the template before the tail gene) rebuilt from today's
    template, the tail gene at its default: (key, table record, CompileOutput)."""
    table = json.loads(lzma.decompress(TABLE.read_bytes()))
    picked = []
    for dtype in rf.problem.dtypes:   # per dtype: a staged, a cluster, a several-rows and an unstaged genome
        keys = sorted(k for k in table["kernels"] if k.endswith(f":{dtype}"))
        for want in (lambda g: g["stage"] == "smem", lambda g: int(g["cluster"]) > 1,
                     lambda g: int(g["rows_per_cta"]) > 1, lambda g: g["stage"] == "none"):
            hit = next((k for k in keys if want(table["genomes"][k.split(":")[0]]["genes"])), None)
            if hit and hit not in picked:
                picked.append(hit)
    compiler = Compiler(tmp_path_factory.mktemp("cache"), workers=2)
    jobs = []
    for key in picked:
        gid, dtype = key.split(":")
        old = table["genomes"][gid]
        assert "tail" not in old["genes"] and not old.get("patch")
        g = Genome.of({**rf.problem.space.defaults(), **old["genes"]})
        jobs.append(CompileJob(compiler.key(render.body(rf.problem, g, dtype)),
                               render.render(rf.problem, Candidate(g), dtype), f"{gid}-{dtype}.cu"))
    by_key = {out.key: out for out in compiler.compile_many(jobs)}
    compiler.close()
    return [(k, table["kernels"][k], by_key[j.key]) for k, j in zip(picked, jobs)]


def test_tail_scalar_builds_the_shipped_cubins_byte_for_byte(shipped_rebuilds):
    assert len(shipped_rebuilds) >= 8
    for key, rec, out in shipped_rebuilds:
        assert out.cubin is not None, (key, out.error)
        assert hashlib.sha256(out.cubin).hexdigest() == rec["sha256"], f"{key}: tail=scalar changed the binary"


def test_tail_never_changes_feasibility():
    """Every path supports tail=peel, so _rule forbids no combination with it: a genome is feasible with peel
    exactly when it is with scalar, and for the same reason."""
    space = rf.problem.space
    rng = random.Random(17)
    for _ in range(3000):
        g = {gene.name: rng.choice(gene.choices) for gene in space.genes}
        assert space.why_infeasible({**g, "tail": "peel"}) == space.why_infeasible({**g, "tail": "scalar"}), g
    for extra in PEEL.values():
        genes(**extra)   # the spread above is feasible (genes() asserts it)


def test_a_genome_from_before_the_gene_takes_tail_scalar():
    old = {k: v for k, v in rf.problem.space.defaults().items() if k != "tail"}
    genome, filled, why = render.adapt(old, {}, rf.problem)
    assert why == "" and filled == ("tail",) and genome.gene_dict["tail"] == "scalar"


def _plan(g: dict, dtype: str, m: int, n: int) -> dict:
    """The recipe's let-bound names (staged, dynamic, ...) at (m, n)."""
    return recipe_names(rf.problem.recipe(g, dtype), m, n)


@pytest.mark.parametrize("dtype", rf.problem.dtypes)
@pytest.mark.parametrize("n", [7, 100, 4100, 5000, 20001, 65537, 4096])
@pytest.mark.parametrize("extra", [dict(stage="smem"), dict(stage="smem", rows_per_cta=2, threads=512),
                                   dict(stage="smem", cluster=4, threads=512),
                                   dict(stage="smem", stage_copy="bulk", persistent=True)])
def test_peel_stages_rows_of_any_width(dtype, n, extra):
    """tail=peel stages a row whose N is no multiple of the vector, in a stage_buf for its floor(N / vec) body
    vectors (the most any head leaves); tail=scalar keeps such rows unstaged, as before."""
    peel, scalar = genes(**extra), genes("scalar", **extra)
    vec = int(peel["vec_bytes"]) // rf.DTYPE_BYTES[dtype]
    body = -(-(n // vec) // int(peel["cluster"]))
    need = int(peel["rows_per_cta"]) * max(0, body - rf.kept_vectors(peel)) * int(peel["vec_bytes"])
    p, s = _plan(peel, dtype, 3, n), _plan(scalar, dtype, 3, n)
    assert rf.staged_bytes(peel, n, dtype) == need
    fits = rf.static_smem(peel) + rf.SMEM_SLACK + need <= rf.MAX_SMEM_PER_CTA
    assert p["staged"] == int(fits) and p["dynamic"] == (need if fits else 0)
    if n % vec:
        assert rf.staged_bytes(scalar, n, dtype) is None and s["staged"] == 0 and s["dynamic"] == 0
    else:
        assert s == p


def test_peel_leaves_the_launch_of_unstaged_genomes_alone():
    for extra in (dict(), dict(persistent=True), dict(cluster=8, threads=1024, unroll=1), dict(load="cp_async")):
        for dtype in rf.problem.dtypes:
            assert rf.problem.recipe(genes(**extra), dtype) == rf.problem.recipe(genes("scalar", **extra), dtype)
