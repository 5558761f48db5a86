"""GPU tests of the KDA forward (issue 31; run on an H200: pytest -m gpu --gpu tests/gpu/test_kda_fwd_gpu.py): the
chunked reference against the token-by-token recurrence at the op's head size in fp32 on the GPU, then every genome
of each form of the template (the recurrent one's 48, the chunked one's 32, half of them mma=mma_sync, gated apart
so that one form's failures do not hide the other's verdict) through the project's gate (fresh inputs, poisoned
outputs, a bitwise repeat) on the correctness shapes and a held-out one, compared with the reference whole."""
from __future__ import annotations

import pytest

from kernel_factory.evo.types import Candidate, Case, Genome, Status
from kernel_factory.problems import kda_reference as kda
from kernel_factory.problems.kda_fwd import CORRECTNESS, problem

pytestmark = pytest.mark.gpu


def test_the_chunked_reference_is_the_recurrence_at_head_size_128():
    import torch
    raw = kda.make_inputs([300, 1, 77], 4, seed=11, device="cuda")
    p = kda.prepare(raw)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], raw["cu_seqlens"].tolist())
    want = kda.recurrent(*args, initial_state=raw["initial_state"])
    got = kda.chunked(*args, initial_state=raw["initial_state"], chunk=64)
    for a, b in zip(got, want):
        assert torch.isfinite(b).all() and b.abs().max() > 1e-2
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form, count", [("recurrent", 48), ("chunked", 32)])
def test_every_genome_passes_the_gate(tmp_path, form, count):
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    cases = [Case(s, "bfloat16") for s in (*CORRECTNESS, (6, 1000, 333, 2))]
    # The gate is the point here: a few timing samples each (the baseline, the chunked form in torch, timed once), so
    # that 48 genomes take about a minute rather than the four a search's timing settings took (2026-12-04).
    ev = GpuEvaluator(problem, cases, "torch_eager", 0, str(tmp_path), compile_workers=8, min_reps=2, max_reps=3,
                      target_ms=0.1, baseline_every_s=0)
    try:
        genomes = [Genome.of(g) for g in problem.space.enumerate() if g["form"] == form]
        results = ev.evaluate([Candidate(g, operator="test") for g in genomes])
    finally:
        ev.close()
    assert len(genomes) == count
    bad = [(g.gene_dict, r.status.value, r.message[:300])
           for g, r in zip(genomes, results) if r.status is not Status.OK]
    assert not bad, bad
    assert all(set(r.times_us) == {c.key for c in cases} for r in results)
    # expected_sass(): a binary that contradicts its PTX genes is flagged, not failed
    assert not [(g.gene_dict, r.flags) for g, r in zip(genomes, results) if r.flags]


def test_the_fla_peer_computes_the_op():
    """FLA's chunk_kda, called as the peer calls it (FlashKDA's gate, norms and sigmoid inside the call), gives the
    reference's outputs: the peer times the same op."""
    import torch
    case = Case((4, 300, 1, 77), "bfloat16")
    inputs = problem.make_inputs(case, 5, "cuda")
    want, got = problem.reference(inputs), problem.baseline("fla", case, inputs)()
    for name in ("o", "final_state"):
        torch.testing.assert_close(got[name].float(), want[name], rtol=2e-2, atol=2e-2)
