"""The fault suite's CPU side: the batch holds every fault and good kernels between them, the compile-time faults
fail in the real compiler (NVRTC / ptxas) with their own messages, and every runtime fault compiles, so that it
reaches the GPU gate it is meant to test. tests/gpu/test_faults_gpu.py runs the batch on a GPU."""
import pytest

from kernel_factory.evo import registry
from kernel_factory.evo.tools import faults
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.problems.rmsnorm_faults import EXPECTED


@pytest.fixture(scope="module")
def compiled():
    problem = registry.load("problem", faults.PROBLEM)
    outs = {}
    for cand in faults.batch():
        job = CompileJob("k", render.render(problem, cand, "bfloat16"), f"{cand.id}.cu")
        outs[cand.genome.gene_dict["fault"], cand.genome.gene_dict["threads"]] = compile_one(job)
    return outs


def test_batch_mixes_every_fault_with_good_kernels():
    genes = [c.genome.gene_dict for c in faults.batch()]
    assert {g["fault"] for g in genes} == set(EXPECTED)
    good = [i for i, g in enumerate(genes) if g["fault"] == "none"]
    assert len(good) >= 3 and good[0] == 0 and good[-1] < len(genes) - 1   # good kernels early, middle and late
    assert len({c.id for c in faults.batch()}) == len(genes)


def test_compile_time_faults_fail_in_the_compiler(compiled):
    syntax = compiled["compile_error", 256]
    assert syntax.cubin is None and "error" in syntax.error
    ptxas = compiled["ptxas_overflow", 256]
    assert ptxas.cubin is None and "shared data" in ptxas.error, ptxas.error[-400:]


def test_runtime_faults_compile(compiled):
    for (fault, threads), out in compiled.items():
        if EXPECTED[fault] != "compile_error":
            assert out.error is None, (fault, out.error)


def test_table_marks_wrong_rows():
    rows = [faults.Row("hang", 256, "timeout", "timeout", "no answer", 10.0),
            faults.Row("race", 256, "incorrect", "ok", "", 0.4)]
    text = faults.table(rows, 1)
    assert "| yes |" in text and "| NO |" in text and "1/2 right; worker restarts: 1" in text
