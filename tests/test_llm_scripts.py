"""The H200 run's scripted edits do what the script says: the good and repaired reductions compile with NVRTC for
every REDUCE choice, the wrong one compiles too (its fault is for the GPU check to find), the broken one does not."""
import json
from pathlib import Path

import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.types import Candidate, Genome
from kernel_factory.operators import llm_edits

SCRIPT = json.loads((Path(__file__).parent / "llm_scripts" / "h200.json").read_text())


def patched(problem, reply: str, genes: dict) -> Genome:
    edit = llm_edits.parse(reply)
    new = llm_edits.apply(edit, regions_of(problem.template()))
    return Genome.of(genes, {edit.region: new})


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    c = Compiler(tmp_path_factory.mktemp("cache"), workers=4)
    yield c
    c.close()


def compile_all(compiler, problem, genomes):
    jobs = [CompileJob(compiler.key(render.body(problem, g, "bfloat16")),
                       render.render(problem, Candidate(g), "bfloat16"), f"{g.id}.cu") for g in genomes]
    return {o.key: o for o in compiler.compile_many(jobs)}, jobs


@pytest.mark.slow
def test_scripted_edits_compile_as_the_script_says(compiler, rmsnorm):
    steps = [s["reply"] for s in SCRIPT["steps"]]
    good, wrong, broken, fixed, repaired = steps
    base = rmsnorm.space.defaults()
    variants = [base, {**base, "reduce": "smem"}, {**base, "threads": 128, "rows_per_cta": 4}]
    expect = {good: True, wrong: True, fixed: True, repaired: True, broken: False}
    genomes = [(patched(rmsnorm, reply, genes), ok) for reply, ok in expect.items() for genes in variants]
    outs, jobs = compile_all(compiler, rmsnorm, [g for g, _ in genomes])
    for (genome, ok), job in zip(genomes, jobs):
        out = outs[job.key]
        assert (out.error is None) == ok, (genome.patch_dict, out.error)
    assert "warp_total" in outs[jobs[len(variants) * 4].key].error
