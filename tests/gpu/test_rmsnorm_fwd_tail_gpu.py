"""GPU test of the forward template's tail=peel rows (run on an H200: pytest -m gpu --gpu
tests/gpu/test_rmsnorm_fwd_tail_gpu.py): peel genomes across the space go through the project's correctness gate
(fresh random inputs, outputs poisoned with NaN and fenced by canaries, a second call on the same buffers, a repeat
that must be bitwise equal, adversarial rows) at widths that are no multiple of any vector, in all three dtypes, and
on x and y views that start an odd number of elements past an aligned address (the peeled head; with y aligned
instead, the scalar fallback). Nothing is timed."""
from __future__ import annotations

import itertools
import random

import pytest

from kernel_factory.evo.evaluate import gate, render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems.rmsnorm_fwd import problem

pytestmark = pytest.mark.gpu

WIDTHS = (1, 7, 100, 1001, 4100, 5000, 20001, 65537)
ROWS = (1, 3, 133)
# Misaligned views: N % VEC == 0 (every row has the same head, so a persistent staged CTA prefetches) and not.
SHIFTED = ((133, 4096), (3, 5000), (1, 7), (133, 20001))

GENOMES = {
    "peel": {},
    "vec8": dict(vec_bytes=8),
    "nokeep_unroll4_cs": dict(keep_x=False, unroll=4, store="cs"),
    "plain_precise_smem": dict(load="plain", rsqrt="precise", reduce="smem"),
    "cp_async": dict(load="cp_async"),
    "cp_async_rows4": dict(load="cp_async", threads=128, rows_per_cta=4, unroll=1),
    "rows2": dict(rows_per_cta=2),
    "rows4_vec8": dict(threads=128, rows_per_cta=4, vec_bytes=8),
    "persistent": dict(persistent=True),
    "persistent_ring": dict(persistent=True, load="cp_async", unroll=1),
    "persistent_rows4": dict(persistent=True, threads=128, rows_per_cta=4),
    "stage": dict(stage="smem"),
    "stage_rows4_vec8": dict(stage="smem", threads=128, rows_per_cta=4, vec_bytes=8),
    "stage_bulk_rows2": dict(stage="smem", stage_copy="bulk", rows_per_cta=2),
    "persistent_stage": dict(persistent=True, stage="smem"),
    "persistent_stage_rows4": dict(persistent=True, stage="smem", threads=128, rows_per_cta=4),
    "persistent_bulk": dict(persistent=True, stage="smem", stage_copy="bulk"),
    "cluster2": dict(cluster=2),
    "cluster4_stage_512": dict(cluster=4, stage="smem", threads=512),
    "cluster8_bulk_1024": dict(cluster=8, stage="smem", stage_copy="bulk", threads=1024, keep_x=False),
    "cluster16_stage": dict(cluster=16, stage="smem", threads=512),
    "cluster4_ring": dict(cluster=4, load="cp_async", unroll=1),
    "w_regs": dict(w_ahead="regs"),
    "w_regs_ring": dict(w_ahead="regs", load="cp_async"),
    "w_regs_rows2_vec8": dict(w_ahead="regs", rows_per_cta=2, vec_bytes=8),
    "w_regs_stage_rows4": dict(w_ahead="regs", stage="smem", threads=128, rows_per_cta=4),
    "w_regs_cluster4": dict(w_ahead="regs", cluster=4),
    "w_l2_nokeep_unroll4": dict(w_ahead="l2", keep_x=False, unroll=4),
    "w_l2_persistent_stage": dict(w_ahead="l2", persistent=True, stage="smem"),
}


def genes_of(name: str) -> dict:
    g = {**problem.space.defaults(), **GENOMES[name], "tail": "peel"}
    assert problem.space.why_infeasible(g) is None, (name, problem.space.why_infeasible(g))
    return g


def load_modules(cache, genes: dict[str, dict], dtypes=problem.dtypes) -> dict:
    """(genome name, dtype) -> loaded cubin of genes[name] in dtype, compiled together on the host's CPUs."""
    from kernel_factory.evo.evaluate import launcher
    compiler = Compiler(cache, workers=8)
    keys, jobs = [], []
    for name, dtype in itertools.product(genes, dtypes):
        genome = Genome.of(genes[name])
        key = compiler.key(render.body(problem, genome, dtype))
        jobs.append(CompileJob(key, render.render(problem, Candidate(genome), dtype), f"{name}-{dtype}.cu"))
        keys.append(((name, dtype), key))
    outs = {o.key: o for o in compiler.compile_many(jobs)}
    compiler.close()
    failed = {k: outs[key].error for k, key in keys if outs[key].cubin is None}
    assert not failed, failed
    return {k: launcher.Module(outs[key].cubin, problem.kernel_name) for k, key in keys}


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    return load_modules(tmp_path_factory.mktemp("cache"), {name: genes_of(name) for name in GENOMES})


def runner(module, genes: dict, case: Case):
    """The gate's launch(inputs, outputs): the candidate on the given tensors, synchronized."""
    import torch
    from kernel_factory.evo.evaluate import launcher

    def launch(inputs, outputs):
        torch.cuda.synchronize()
        launcher.launcher(launcher.torch_stream(), module, problem.launch(genes, case, inputs, outputs))()
        torch.cuda.synchronize()
    return launch


class Shifted:
    """A launch on copies of x (and of y, when y_shift is given) that start `shift` elements past a 4 KB-aligned
    address, inside NaN-filled scratch buffers; y's copy goes back to the gate's (poisoned, fenced) output, and any
    write to y's scratch outside its view fails the launch."""

    def __init__(self, module, genes: dict, case: Case, shift: int, y_shift: int | None):
        self.inner, self.case, self.shift, self.y_shift = runner(module, genes, case), case, shift, y_shift
        self.problems: list[str] = []

    def __call__(self, inputs, outputs):
        import torch
        m, n = self.case.shape
        x = inputs["x"]
        pad = 4096 // x.element_size()
        xbuf = torch.randn(m * n + 2 * pad, device=x.device).to(x.dtype)
        xv = xbuf[pad + self.shift:pad + self.shift + m * n].view(m, n)
        xv.copy_(x)
        if self.y_shift is None:
            self.inner({**inputs, "x": xv}, outputs)
            return
        ybuf = torch.full((m * n + 2 * pad,), float("nan"), device=x.device, dtype=x.dtype)
        lo = pad + self.y_shift
        yv = ybuf[lo:lo + m * n].view(m, n)
        self.inner({**inputs, "x": xv}, {**outputs, "y": yv})
        outside = torch.cat([ybuf[:lo], ybuf[lo + m * n:]])
        if not bool(torch.isnan(outside.float()).all()):
            self.problems.append(f"{self.case.key}: wrote outside the shifted y view")
        outputs["y"].copy_(yv)


def check(launch, case: Case, seed: int) -> str | None:
    return gate.Gate(problem, launch, device="cuda").check(case, random.Random(seed))


@pytest.mark.parametrize("dtype", problem.dtypes)
@pytest.mark.parametrize("name", list(GENOMES))
def test_peel_genome_passes_the_gate_at_odd_widths(modules, name, dtype):
    genes, bad = genes_of(name), []
    for i, (m, n) in enumerate(itertools.product(ROWS, WIDTHS)):
        case = Case((m, n), dtype)
        why = check(runner(modules[name, dtype], genes, case), case, i)
        if why:
            bad.append(why[:300])
    assert not bad, f"{name} {dtype}: {len(bad)} cases failed:\n" + "\n".join(bad)


@pytest.mark.parametrize("dtype", problem.dtypes)
@pytest.mark.parametrize("name", list(GENOMES))
def test_peel_genome_passes_the_gate_on_misaligned_views(modules, name, dtype):
    genes, bad = genes_of(name), []
    for i, ((m, n), shift, y_shift) in enumerate(itertools.product(SHIFTED, (1, 3), ("same", "aligned"))):
        case = Case((m, n), dtype)
        shifted = Shifted(modules[name, dtype], genes, case, shift, shift if y_shift == "same" else None)
        why = check(shifted, case, 100 + i) or "; ".join(shifted.problems)
        if why:
            bad.append(f"x shift {shift}, y {y_shift}: {why[:300]}")
    assert not bad, f"{name} {dtype}: {len(bad)} cases failed:\n" + "\n".join(bad)
