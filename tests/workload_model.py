"""The stand-in for the GPU evaluator that the CPU campaign tests share (test_workload.py,
test_workload_relearn.py): a deterministic cost model of genes and shape, with a ledger of what it was asked."""
from __future__ import annotations

import math

import pytest

from kernel_factory.evo import build
from kernel_factory.evo.protocols import EvaluatorInfo
from kernel_factory.evo.types import Case, EvalResult, Genome, Status, geomean_speedup
from kernel_factory.evo.workload import ELEM_BYTES
from kernel_factory.problems.rmsnorm_fwd import problem as fwd


class CostModel:
    """Stands in for the GPU evaluator: a deterministic time per (genes, case) from a roofline and penalties that
    make different buckets prefer different genomes, a ledger of every case it was built for and the genomes it
    evaluated."""

    ledger: list[Case] = []
    evaluated: list[Genome] = []

    def __init__(self, cases, space=fwd.space):
        self.cases, self.space = tuple(cases), space
        CostModel.ledger += self.cases
        self.info = EvaluatorInfo("gpu", "cost model (test)", {"gpu": "cost model"})

    @staticmethod
    def time_us(genes, case) -> float:
        m, n = case.shape
        row_bytes = n * ELEM_BYTES[case.dtype]
        t = 3.0 + 2 * m * row_bytes / 3e6
        rows_per_sm = m / 132
        t *= 1 + 0.2 * abs(math.log2(int(genes["threads"])) - (7 if row_bytes <= 2048 else 10))
        t *= 1.0 if (int(genes["cluster"]) > 1) == (rows_per_sm < 1 and row_bytes > 16384) else 1.3
        t *= 1.0 if (genes["load"] == "nc") == (n % 8 == 0) else 1.15
        return t

    def evaluate(self, candidates):
        out = []
        for cand in candidates:
            CostModel.evaluated.append(cand.genome)
            genes = {**self.space.defaults(), **cand.genome.gene_dict}
            times = {c.key: self.time_us(genes, c) for c in self.cases}
            base = {c.key: 1.2 * self.time_us(self.space.defaults(), c) for c in self.cases}
            out.append(EvalResult(cand.id, Status.OK, geomean_speedup(times, base), times, {}, base,
                                  evaluator="gpu", gpu_s=0.01))
        return out

    def close(self):
        pass


@pytest.fixture
def model_gpu(monkeypatch):
    CostModel.ledger, CostModel.evaluated = [], []
    monkeypatch.setattr(build, "evaluator_kind", lambda cfg: ("gpu", None))
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind: CostModel(run.cases, run.problem.space))
    return CostModel
