"""Proves a problem shipped as its own package (tests/plugins/kf_softmax) plugs in with no change to evo/."""
# CI installs it first with `pip install --no-deps ./tests/plugins/kf_softmax`. Without it these tests fail rather
# than skip: a skipped test would hide a broken discovery path.
from __future__ import annotations

from collections import Counter
from importlib.metadata import entry_points

import pytest
import torch

from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler, compile_one
from kernel_factory.evo.protocols import Problem
from kernel_factory.evo.types import Candidate, Case, Genome

NAME = "softmax_fwd"
INSTALL = "pip install --no-deps ./tests/plugins/kf_softmax"


@pytest.fixture(scope="module")
def softmax() -> Problem:
    if NAME not in registry.available("problem"):
        pytest.fail(f"the softmax plugin is not installed; run `{INSTALL}` from the repository root", pytrace=False)
    return registry.load("problem", NAME)


def test_entry_point_is_registered():
    names = {ep.name for ep in entry_points(group="kernel_factory.problems")}
    assert NAME in names, f"no {NAME!r} entry point among {sorted(names)}; run `{INSTALL}` from the repository root"


def test_loads_through_the_registry_as_a_problem(softmax):
    assert isinstance(softmax, Problem)
    assert softmax.name == NAME and softmax.kernel_name == NAME
    assert type(softmax).__module__ == "kf_softmax.problem", "must come from the plugin, not from the factory"


def test_space_has_a_real_rule(softmax):
    feasible = list(softmax.space.enumerate())
    assert 20 <= len(feasible) < softmax.space.size()
    reason = softmax.space.why_infeasible({**softmax.space.defaults(), "threads": 128, "rows_per_cta": 8})
    assert reason and "whole warps" in reason


def test_reference_is_a_softmax(softmax):
    case = Case((5, 33), "float32")
    y = softmax.reference(softmax.make_inputs(case, 1, "cpu"))["y"]
    assert y.shape == (5, 33) and y.dtype == torch.float32
    assert torch.allclose(y.sum(-1), torch.ones(5), atol=1e-5)


def test_inputs_follow_the_seed(softmax):
    case = Case((5, 33), "float32")
    a, b, c = (softmax.make_inputs(case, s, "cpu")["x"] for s in (1, 1, 2))
    assert torch.equal(a, b), "the same seed must give the same x"
    assert not torch.equal(a, c), "another seed must give another x"


def test_template_compiles_for_the_whole_space(softmax, tmp_path):
    """Every feasible genome in bfloat16 and the defaults in the other dtypes, through the factory's own compiler."""
    compiler = Compiler(tmp_path / "cache", workers=2)
    try:
        builds = [(Genome.of(g), "bfloat16") for g in softmax.space.enumerate()]
        builds += [(Genome.of(softmax.space.defaults()), dt) for dt in softmax.dtypes if dt != "bfloat16"]
        labels = {}
        jobs = []
        for genome, dt in builds:
            key = compiler.key(render.body(softmax, genome, dt))
            labels[key] = f"{genome.gene_dict} {dt}"
            jobs.append(CompileJob(key, render.render(softmax, Candidate(genome), dt), f"{genome.id}-{dt}.cu"))
        outputs = list(compiler.compile_many(jobs))
    finally:
        compiler.close()
    assert len(outputs) == len(set(labels)) == len(builds)
    for out in outputs:
        assert out.error is None, f"{labels[out.key]} failed to compile:\n{out.error}"
        assert out.cubin, labels[out.key]
        assert out.info.registers and out.info.registers > 0, f"{labels[out.key]}: no register count in\n{out.info.log}"


def opcodes(problem: Problem, **genes) -> Counter:
    cand = Candidate(Genome.of({**problem.space.defaults(), **genes}))
    out = compile_one(CompileJob("k", render.render(problem, cand, "bfloat16"), "k.cu"))
    assert out.error is None, out.error
    return sass.opcodes(sass.disassemble(out.cubin))


def test_genes_reach_the_binary(softmax):
    """Each gene changes the SASS the way its doc says, so that a measurement of a gene measures that gene."""
    nc16 = opcodes(softmax, vec_bytes=16, load="nc")
    plain16 = opcodes(softmax, vec_bytes=16, load="plain")
    nc8 = opcodes(softmax, vec_bytes=8, load="nc")
    assert nc16["LDG.E.128.CONSTANT"] and nc16["STG.E.128"] and not nc16["STG.E.64"]
    assert plain16["LDG.E.128"] and not plain16["LDG.E.128.CONSTANT"] and not nc16["LDG.E.128"]
    assert nc8["LDG.E.64.CONSTANT"] and nc8["STG.E.64"] and not nc8["STG.E.128"]
    # expf's range reduction (FFMA.SAT) appears only with the precise choice; both end in MUFU.EX2
    approx, precise = opcodes(softmax, exp="approx"), opcodes(softmax, exp="precise")
    assert approx["MUFU.EX2"] and not approx["FFMA.SAT"] and precise["FFMA.SAT"]
    # warp per row (256 threads, 8 rows) reduces with shuffles alone: no CTA barrier
    warp_per_row = opcodes(softmax, threads=256, rows_per_cta=8)
    assert nc16["BAR.SYNC.DEFER_BLOCKING"] and not warp_per_row["BAR.SYNC.DEFER_BLOCKING"]
