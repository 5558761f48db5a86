"""The KDA forward's chunked form (kernels/kda_chunked.cuh) on the CPU, before any GPU has run it: the gene space
keeps each form to its own genes and leaves the 48 recurrent genomes' launches as they were gated on the H200; the
kernel's algebra, step by step as the kernel takes it (partial chunks padded with zero tokens, both solves), equals
the recurrence; every chunked genome compiles for sm_90a without spills, and its SASS holds what its PTX genes
choose."""
from __future__ import annotations

import itertools
import re
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from kernel_factory.evo.evaluate import render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems import kda_reference as kda
from kernel_factory.problems.kda_fwd import CHUNK_THREADS, CHUNK_V, HEAD, chunked_smem, problem

MAX_DYNAMIC_SMEM = 227 * 1024   # sm_90's opt-in limit per CTA


def _genomes(form):
    return [g for g in problem.space.enumerate() if g["form"] == form]


def test_each_form_reads_only_its_own_genes():
    recurrent, chunked = _genomes("recurrent"), _genomes("chunked")
    # chunks of 16, 32 and 64 by substitution, of 16 by the product form; each under both exp, both load and both mma
    assert len(recurrent) == 48 and len(chunked) == 4 * 2 * 2 * 2 and problem.space.defaults()["form"] == "recurrent"
    assert {(g["chunk"], g["solve"], g["mma"]) for g in recurrent} == {(64, "substitution", "fma")}
    assert {(g["v_block"], g["k_lanes"]) for g in chunked} == {(64, 4)}
    pinned = {g: problem.space.defaults()[g] for g in ("form", "chunk", "solve", "mma")}
    assert [dict(zip(("v_block", "k_lanes", "exp", "load"), c)) | pinned for c in itertools.product(
        (32, 64, 128), (1, 2, 4, 8), ("approx", "precise"), ("plain", "nc"))] == recurrent
    assert problem.space.why_infeasible({**problem.space.defaults(), "chunk": 16}) == \
        "chunk=16 means nothing to form=recurrent: keep it at its default 64"
    assert problem.space.why_infeasible({**problem.space.defaults(), "form": "chunked", "k_lanes": 8}) == \
        "k_lanes=8 means nothing to form=chunked: keep it at its default 4"
    assert problem.space.why_infeasible({**problem.space.defaults(), "form": "chunked", "solve": "neumann"}) == \
        "solve=neumann loses fp32 to its powers of N at chunk=64 where keys are alike: needs chunk=16, or " \
        "solve=substitution"
    assert problem.space.why_infeasible({**problem.space.defaults(), "mma": "mma_sync"}) == \
        "mma='mma_sync' means nothing to form=recurrent: keep it at its default 'fma'"


def test_the_recurrent_launches_are_the_ones_gated_on_the_h200():
    """The recipe the recurrent genomes had before the chunked form (written out here): a grid of 128 / v_block
    slices, v_block * k_lanes threads, no dynamic shared memory."""
    for g in _genomes("recurrent"):
        (step,) = problem.recipe(g, "bfloat16")["steps"]
        assert step == {"kernel": "kda_fwd", "grid": {"x": HEAD // g["v_block"], "y": "heads", "z": "sequences"},
                        "block": {"x": g["v_block"] * g["k_lanes"]},
                        "args": [["ptr", n] for n in ("q", "k", "v", "g_raw", "beta_raw", "A_log", "dt_bias",
                                                      "cu_seqlens", "initial_state", "o", "final_state")]
                        + [["i32", "heads"], ["f32", HEAD ** -0.5]]}


def test_the_chunked_launch_gives_its_shared_memory():
    case = Case((3, 70, 1, 17), "bfloat16")
    inputs, outputs = problem.make_inputs(case, 0, "cpu"), problem.make_outputs(case, "cpu")
    sizes = {}
    for g in _genomes("chunked"):
        (plan,) = problem.launch(g, case, inputs, outputs)
        assert plan.grid == (HEAD // CHUNK_V, 3, 3) and plan.block == (CHUNK_THREADS, 1, 1)
        assert plan.shared_bytes == chunked_smem(g) <= MAX_DYNAMIC_SMEM
        sizes[g["chunk"], g["solve"], g["mma"]] = plan.shared_bytes
    # q, k and the gate (chunk x 129 floats) dominate; the product form adds N's powers (chunk x (chunk + 1))
    assert sizes[64, "substitution", "fma"] == 4 * (3 * 64 * 129 + 2 * 64 * 65 + 64 * 64 + 128 + 3 * 64) == 150016
    assert sizes[16, "neumann", "fma"] - sizes[16, "substitution", "fma"] == 4 * 16 * 17
    assert sizes[16, "substitution", "fma"] < 48 * 1024 < sizes[32, "substitution", "fma"]   # the others: opt-in
    # mma=mma_sync adds the state's copy for the tiles: 128 rows of 64 + 4 floats
    assert {sizes[c, s, "mma_sync"] - sizes[c, s, "fma"] for c, s, _ in sizes} == {4 * 128 * 68}


def _solve(n_mat, rhs, chunk, solve):
    """(I + N) U = rhs as the kernel solves it: row by row, or by the product (I - N)(I + N^2)(I + N^4)..."""
    if solve == "substitution":
        u = rhs.clone()
        for t in range(1, chunk):
            u[:, t] -= torch.einsum("hr,hrv->hv", n_mat[:, t, :t], u[:, :t])
        return u
    u = rhs - n_mat @ rhs
    power, p = 2, n_mat @ n_mat
    while power < chunk:
        u = u + p @ u
        if 2 * power < chunk:
            p = p @ p
        power *= 2
    return u


def _pad(x, chunk):
    return torch.cat([x, x.new_zeros(chunk - x.shape[0], *x.shape[1:])]) if x.shape[0] < chunk else x


def _bf16(x):
    return x.to(torch.bfloat16).to(x.dtype)


TILE = 16   # kda_chunked.cuh CK_TILE: the mma's M and K


def _split_product(a, b):
    """kda_chunked.cuh ck_tile_split: a = a_hi + a_lo and b alike, each part bf16; the lo x lo product dropped."""
    a_hi, b_hi = _bf16(a), _bf16(b)
    a_lo, b_lo = _bf16(a - a_hi), _bf16(b - b_hi)
    return a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi


def _pairs_below_the_diagonal_blocks(q, k, gc):
    """mma=mma_sync's N (unscaled by beta) and B below the diagonal 16-token blocks: per row block, its first token m
    is the reference, exp(gc_t - gc_m) times k_t or q_t and exp(gc_m - gc_r) times k_r each rounded to bf16 (the
    operands), summed in full precision; entries at or above the diagonal blocks are zero here."""
    chunk = k.shape[1]
    ref = gc[:, (torch.arange(chunk) // TILE) * TILE]                    # gc_m of each row t's block
    early = torch.arange(chunk)[None, :] < ((torch.arange(chunk) // TILE) * TILE)[:, None]   # [t, r]: r < m_t
    late_k, late_q = (_bf16(x * torch.exp(gc - ref)) for x in (k, q))   # [h, t, j]
    diff = (ref[:, :, None] - gc[:, None]).masked_fill(~early[None, :, :, None], -torch.inf)   # [h, t, r, j]
    kr = _bf16(k[:, None] * torch.exp(diff))
    return torch.einsum("htj,htrj->htr", late_k, kr), torch.einsum("htj,htrj->htr", late_q, kr), early


def _kernel_steps(p, cu, state, chunk, solve, mma="fma"):
    """The chunked kernel's algebra in its own order: every chunk `chunk` tokens long, a partial one padded with zero
    tokens (zero gate, zero beta); gc_n is the padded chunk's last cumulative gate. Under mma=mma_sync each product's
    operands are rounded to bf16 where the kernel's tiles round them (their sums stay in the working precision)."""
    rnd = _bf16 if mma == "mma_sync" else (lambda x: x)
    o = torch.empty_like(p["v"])
    states = state.clone()
    scale = p["q"].shape[-1] ** -0.5
    for i, (start, end) in enumerate(zip(cu, cu[1:])):
        s = states[i]
        for c0 in range(start, end, chunk):
            n = min(chunk, end - c0)
            q, k, v, g, beta = (_pad(p[x][c0:c0 + n], chunk).transpose(0, 1) for x in ("q", "k", "v", "g", "beta"))
            gc = g.cumsum(1)
            upto = torch.ones(chunk, chunk, dtype=torch.bool).tril()
            decay = torch.exp((gc[:, :, None] - gc[:, None]).masked_fill(~upto[None, :, :, None], 0.0))
            n_mat = torch.einsum("htk,hrk,htrk->htr", k, k, decay)
            b_mat = torch.einsum("htk,hrk,htrk->htr", q, k, decay)
            if mma == "mma_sync":
                n_off, b_off, below = _pairs_below_the_diagonal_blocks(q, k, gc)
                n_mat, b_mat = (torch.where(below, off, exact) for off, exact in ((n_off, n_mat), (b_off, b_mat)))
            n_mat, b_mat = beta[..., None] * n_mat * upto.tril(-1), b_mat * upto
            rhs = beta[..., None] * (v - rnd(torch.exp(gc) * k) @ rnd(s))
            u = _solve(n_mat, rhs, chunk, solve)
            o[c0:c0 + n] = (scale * (rnd(torch.exp(gc) * q) @ rnd(s) + rnd(b_mat) @ rnd(u))).transpose(0, 1)[:n]
            last = gc[:, -1]
            update = (torch.exp(last[:, None] - gc) * k).transpose(1, 2)
            s = torch.exp(last)[..., None] * s + (_split_product(update, u) if mma == "mma_sync" else update @ u)
        states[i] = s
    return o, states


@pytest.mark.parametrize("chunk, solve", list(itertools.product((16, 32, 64), ("substitution", "neumann"))))
def test_the_kernels_steps_are_the_recurrence(chunk, solve):
    """In float64, so that the algebra is what is checked: padded partial chunks and the product form are exact."""
    lengths = [5, 37, 64, 1, 130]
    raw = kda.make_inputs(lengths, 2, seed=chunk, head_k=16, head_v=24, dtype=torch.float64)
    p = kda.prepare(raw, torch.float64)
    cu, state = raw["cu_seqlens"].tolist(), raw["initial_state"].double()
    want = kda.recurrent(p["q"], p["k"], p["v"], p["g"], p["beta"], cu, initial_state=state)
    got = _kernel_steps(p, cu, state, chunk, solve)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("solve", ["substitution", "neumann"])
def test_the_kernels_steps_hold_the_tolerance_in_fp32_at_head_size_128(solve):
    """fp32 throughout, chunks of 64 (N's highest powers): within a tenth of the problem's tolerance of the float64
    recurrence, so that the gate's margin is left to bf16 inputs and the GPU's sums."""
    raw = kda.make_inputs([200, 77], 2, seed=3)
    cu = raw["cu_seqlens"].tolist()
    exact = kda.recurrent(*(kda.prepare(raw, torch.float64)[n] for n in ("q", "k", "v", "g", "beta")), cu,
                          initial_state=raw["initial_state"].double())
    got = _kernel_steps(kda.prepare(raw), cu, raw["initial_state"], 64, solve)
    atol, rtol = problem.tolerance("bfloat16")
    for a, b in zip(got, exact):
        torch.testing.assert_close(a.double(), b, atol=atol / 10, rtol=rtol / 10)


@pytest.mark.parametrize("hard", [False, True], ids=["random", "alike_keys"])
def test_the_mma_tiles_bf16_operands_hold_the_tolerance_on_long_sequences(hard):
    """mma=mma_sync's roundings (the kernel's steps with each tile's operands in bf16) over 4096 tokens, where the
    state carries them longest: within a tenth of the problem's tolerance on the gate's random inputs, and half of it
    where keys are alike with almost no decay (measured: 0.13 of it on o, 0.21 on the state; with S's update from
    plain bf16 operands rather than split ones the state broke the tolerance threefold there)."""
    raw = kda.make_inputs([4096, 300], 2, seed=3)
    raw = alike_keys(raw, 0.9) if hard else raw
    cu = raw["cu_seqlens"].tolist()
    exact = kda.recurrent(*(kda.prepare(raw, torch.float64)[n] for n in ("q", "k", "v", "g", "beta")), cu,
                          initial_state=raw["initial_state"].double())
    got = _kernel_steps(kda.prepare(raw), cu, raw["initial_state"], 64, "substitution", "mma_sync")
    share = 0.5 if hard else 0.1
    atol, rtol = problem.tolerance("bfloat16")
    for a, b in zip(got, exact):
        torch.testing.assert_close(a.double(), b, atol=atol * share, rtol=rtol * share)


def alike_keys(raw, share):
    """FlashKDA-shaped raw inputs made hard for a chunk's solve: every key `share` of one key, beta near 1 and
    almost no decay, so that N's entries near 1 and its powers grow like binomials."""
    raw = dict(raw)
    raw["k"] = (share * raw["k"][:1].float() + (1 - share) * raw["k"].float()).to(raw["k"].dtype)
    raw["dt_bias"] = raw["dt_bias"] - 30.0
    raw["beta_raw"] = torch.full_like(raw["beta_raw"], 6.0)
    return raw


@pytest.mark.parametrize("chunk, solve, share, atol", [(64, "substitution", 1.0, 1e-6), (16, "neumann", 1.0, 1e-4),
                                                       (32, "neumann", 0.9, None), (64, "neumann", 0.5, None)])
def test_the_product_form_loses_fp32_past_chunks_of_16_where_keys_are_alike(chunk, solve, share, atol):
    """Why the space's rule keeps solve=neumann to chunks of 16: fp32 throughout, against the float64 recurrence."""
    raw = alike_keys(kda.make_inputs([128], 1, seed=1), share)
    cu = raw["cu_seqlens"].tolist()
    exact = kda.recurrent(*(kda.prepare(raw, torch.float64)[n] for n in ("q", "k", "v", "g", "beta")), cu,
                          initial_state=raw["initial_state"].double())
    err = (_kernel_steps(kda.prepare(raw), cu, raw["initial_state"], chunk, solve)[0].double() - exact[0]).abs().max()
    assert exact[0].abs().max() > 0.05
    assert err < atol if atol else err > 1.0, float(err)


def _compiled(genes):
    out = compile_one(CompileJob("k", render.render(problem, Candidate(Genome.of(genes)), "bfloat16"), "k.cu"))
    assert out.error is None, out.error[-3000:]
    return out.info, sass.opcodes(sass.disassemble(out.cubin))


def test_every_chunked_genome_compiles_without_spills_and_its_sass_follows_its_genes():
    """expected_sass() holds each PTX gene's choice: load, exp, and mma=mma_sync alone with HMMA (bf16 in, fp32 out)."""
    genomes = _genomes("chunked")
    with ProcessPoolExecutor(2) as pool:
        built = list(pool.map(_compiled, genomes))
    for g, (info, ops) in zip(genomes, built):
        assert info.spill_stores == info.spill_loads == info.local_bytes == 0, (g, info.log)
        for pattern, present, why in problem.expected_sass(g, "bfloat16"):
            assert any(re.match(pattern, op) for op in ops) == present, (g, pattern, why)
        hmma = {op for op in ops if op.startswith("HMMA")}
        assert hmma == ({"HMMA.16816.F32.BF16"} if g["mma"] == "mma_sync" else set()), (g, hmma)
