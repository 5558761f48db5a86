"""The RMSNorm backward problem on the CPU: its reference against autograd, tolerances that admit another summation
order but not a dropped row, launch plans (grid, scratch, shared memory) and the rows and columns they cover, and the
gene rule. Its NVRTC builds and SASS marks: tests/test_rmsnorm_bwd_sass.py."""
import math
import random

import numpy as np
import pytest
import torch

from bwd_genomes import DEFAULT, SPREAD, genes
from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import measure
from kernel_factory.evo.protocols import Launch, MissingBaseline
from kernel_factory.evo.types import Case
from kernel_factory.problems import rmsnorm_bwd as mod

P = mod.problem


def every_case():
    return [(shape, dt) for dt in P.dtypes for s in ("benchmark", "correctness", "heldout") for shape in P.shape_sets[s]]


# ---- registration, shapes, space ------------------------------------------------------------------------------
def test_registered_with_the_public_matrix():
    assert registry.load("problem", "rmsnorm_bwd") is P and P.name == P.kernel_name == "rmsnorm_bwd"
    assert P.shape_sets["benchmark"][:9] == tuple((32768, 1 << k) for k in range(8, 17))
    assert P.shape_sets["benchmark"][9:] == ((16384, 131072), (8192, 262144))
    odd = P.shape_sets["correctness"]
    assert min(m for m, _ in odd) == 1 and min(n for _, n in odd) < 32 and any(n % 2 for _, n in odd)
    assert {33, 760, 1128, 4100, 262144} <= {n for _, n in odd}
    assert P.shape_sets["heldout"] == ((4096, 2880), (4096, 3584), (4096, 5120), (4096, 7168), (1, 7168))
    assert P.bytes_moved(Case((32768, 4096), "bfloat16")) == 3 * 32768 * 4096 * 2 + 4 * 4096
    assert P.baselines[0] == "torch_eager" and mod.EPS == 1e-6


def test_space_is_tens_of_thousands_and_every_value_is_reachable():
    feasible = list(P.space.enumerate())
    # small_m (a launch plan, one kernel) made it ~2.7x, narrow 2x, tail=peel (rows_per_cta=1 only) ~1.6x, and
    # small_m=cols 4/3x (1.1 million)
    assert 300 <= len(feasible) <= 1500000, len(feasible)
    for gene in P.space.genes:
        assert {g[gene.name] for g in feasible} == set(gene.choices), gene.name
    taken = {(k, genes(**kw)[k]) for kw in SPREAD for k in DEFAULT}
    assert taken >= {(g.name, c) for g in P.space.genes for c in g.choices}, "SPREAD must take every gene value"


@pytest.mark.parametrize("kw, words", [
    (dict(threads=512, rows_per_cta=64, reduce="smem"), "shuffles"),
    (dict(threads=1024, ctas_per_sm=4), "threads of an SM"),
    (dict(threads=128, ctas_per_sm=2), "persistent grid busy"), (dict(threads=512, rows_per_cta=2), "CTA of its own"),
    (dict(cluster=2, threads=512, rows_per_cta=4), "rows_per_cta=1"),
    (dict(cluster=4, threads=256), "threads >= 512"),
    (dict(cluster=4, threads=128, ctas_per_sm=4, stages=2, prefetch=False, reg_vecs=1, rows_per_cta=4),
     "rows_per_cta=1"),
    (dict(threads=128, ctas_per_sm=1, reg_vecs=1), "persistent grid busy"),   # a ring would allow 4 warps per SM
    (dict(threads=256, ctas_per_sm=2, reg_vecs=8, prefetch=False), "registers"),
    (dict(threads=256, ctas_per_sm=2, reg_vecs=8, stages=2, prefetch=False, vec_bytes=8), "registers"),
    (dict(threads=256, rows_per_cta=8, reduce="smem"), "shuffles"),
    (dict(threads=1024, ctas_per_sm=1, reg_vecs=4), "registers"),
    (dict(threads=256, ctas_per_sm=4, reg_vecs=1, prefetch=True), "registers"),
    (dict(stages=2, prefetch=True), "needs prefetch=False"),
    (dict(cluster_sum="warps"), "needs cluster > 1"),
    (dict(threads=512, cluster=2, ctas_per_sm=1, reduce="smem", cluster_sum="warps"), "reduce=shfl"),
    (dict(threads=512, ctas_per_sm=2, reg_vecs=2, stages=4, prefetch=False), "no room for 2 CTAs per SM"),
    (dict(threads=1024, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=4, prefetch=False), "no room"),
])
def test_rule_rejects_with_a_reason(kw, words):
    reason = P.space.why_infeasible({**DEFAULT, **kw})
    assert reason and words in reason, reason


# ---- reference, inputs, tolerances ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", P.dtypes)
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (17, 760), (9, 1128)])
def test_reference_is_the_gradient_of_rmsnorm(shape, dtype):
    inputs = P.make_inputs(Case(shape, dtype), 3, "cpu")
    x = inputs["x"].double().requires_grad_(True)
    w = inputs["w"].double().requires_grad_(True)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + mod.EPS) * w
    dx, dw = torch.autograd.grad(y, (x, w), inputs["dy"].double())
    ref = P.reference(inputs)
    assert ref["dx"].dtype == ref["dw"].dtype == torch.float32
    assert torch.allclose(ref["dx"].double(), dx, rtol=1e-4, atol=1e-5 * float(dx.abs().max()))
    assert torch.allclose(ref["dw"].double(), dw, rtol=1e-4, atol=1e-5 * float(dw.abs().max()))
    rstd = torch.rsqrt(inputs["x"].float().square().mean(-1) + mod.EPS)
    assert torch.equal(inputs["rstd"], rstd) and inputs["w"].dtype == torch.float32


def kernel_order(inputs, slots, dtype):
    """dx and dw summed in the kernel's order: the row sum in 32 interleaved pieces, dw per slot then over slots."""
    xf, dyf, w, r = inputs["x"].float(), inputs["dy"].float(), inputs["w"], inputs["rstd"][:, None]
    m, n = xf.shape
    s = sum((dyf * w * xf)[:, i::32].sum(-1, keepdim=True) for i in range(32))
    c = r * (s / n)
    xhat = xf * r
    dx = (r * (dyf * w - xhat * c)).to(getattr(torch, dtype))
    terms = torch.cat([dyf * xhat, torch.zeros(-m % slots, n)]).view(-1, slots, n)
    partial = torch.zeros(slots, n)
    for i in range(terms.shape[0]):
        partial += terms[i]
    dw = torch.zeros(n)
    for p in range(slots):
        dw += partial[p]
    return {"dx": dx, "dw": dw}


@pytest.mark.parametrize("dtype", P.dtypes)
def test_tolerance_admits_another_order_but_not_a_dropped_row(dtype):
    inputs = P.make_inputs(Case((8192, 256), dtype), 5, "cpu")
    ref, atol, rtol = P.reference(inputs), *P.tolerance(dtype)
    got = kernel_order(inputs, 264, dtype)
    for name in ref:
        assert measure.mismatch(got[name], ref[name], atol, rtol, name) is None
    dropped = dict(inputs, dy=inputs["dy"].clone())
    dropped["dy"][4321] = 0
    assert measure.mismatch(kernel_order(dropped, 264, dtype)["dw"], ref["dw"], atol, rtol, "dw") is not None
    assert measure.mismatch((got["dx"].float() * 1.02), ref["dx"], atol, rtol, "dx") is not None


def test_inputs_special_rows_and_sampled_reference():
    case = Case((6, 200), "float16")
    a, b = P.make_inputs(case, 1, "cpu"), P.make_inputs(case, 1, "cpu")
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["x"], P.make_inputs(case, 2, "cpu")["x"])
    special = P.special_inputs(case, 1, "cpu")
    assert not special["x"][0].any() and not special["dy"][1].any()
    assert float(special["rstd"][0]) == pytest.approx(1 / math.sqrt(mod.EPS), rel=1e-6)
    ref = P.reference(special)
    assert all(torch.isfinite(v).all() for v in ref.values()) and float(ref["dx"].abs().max()) < 65504
    rows = torch.tensor([0, 3, 5])
    sub = P.reference_rows(a, rows)
    full = P.reference(a)
    assert torch.allclose(sub["dx"], full["dx"][rows]) and torch.allclose(sub["dw"], full["dw"], rtol=1e-5, atol=1e-5)


def test_baselines_fail_as_values_here():
    case = Case((4, 64), "float32")
    inputs = P.make_inputs(case, 0, "cpu")
    with pytest.raises(MissingBaseline):
        P.baseline("nope", case, inputs)
    eager = P.baseline("torch_eager", case, inputs)()
    ref = P.reference(inputs)
    assert torch.allclose(eager["dx"], ref["dx"], rtol=1e-4, atol=1e-4)
    assert torch.allclose(eager["dw"], ref["dw"], rtol=1e-4, atol=1e-4)
    dx, dw = mod._compiled_backward(inputs["x"], inputs["w"], inputs["dy"], inputs["rstd"])
    assert torch.allclose(dx, ref["dx"], rtol=1e-5, atol=1e-5) and torch.allclose(dw, ref["dw"], rtol=1e-5, atol=1e-5)
    for name in ("quack", "quack_tuned", "liger", "int21"):
        try:
            P.baseline(name, case, inputs)
        except MissingBaseline:
            pass
        except Exception as exc:   # an installed peer refusing CPU tensors is fine too; a crash in our code is not
            assert not isinstance(exc, (NameError, AttributeError, SyntaxError)), exc


# ---- launch plans ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", SPREAD)
def test_plans_stay_within_grid_scratch_and_shared_memory(kw):
    g = genes(**kw)
    rows, cluster, threads = int(g["rows_per_cta"]), int(g["cluster"]), int(g["threads"])
    for (m, n), dtype in every_case():
        p, label = mod.plan(g, m, n, dtype), f"{kw} {m}x{n} {dtype}"
        width = int(g["vec_bytes"]) // mod.DTYPE_BYTES[dtype]
        assert bool(p.flags & mod.PLAN_VECTOR) == (n % width == 0), label
        assert 1 <= p.slots <= min(-(-m // rows), mod.SMS * int(g["ctas_per_sm"]) // cluster), label
        assert p.grid == p.slots * cluster, label
        # the template writes partial row `slot`, or `slot * rows_per_cta + group` with global partials (sub-warp
        # rows: only for the groups that start within M)
        group_rows = p.slots * rows if threads // rows >= 32 else min(p.slots * rows, m)
        assert p.partial_rows == (group_rows if p.flags & mod.PLAN_DW_GLOBAL else p.slots), label
        assert p.partial_rows <= mod.scratch_rows(m, n), label
        assert mod.scratch_rows(m, n) * n * 4 <= max(mod.SCRATCH_BYTES, mod.MAX_ROWS_PER_CTA * n * 4), label
        assert mod.static_smem(g) + mod.SMEM_SLACK + p.shared_bytes <= 227 * 1024, label
        dw_bytes = p.shared_bytes - mod.ring_bytes(g)   # the ring comes first, then any dw partials
        assert dw_bytes >= 0 and (dw_bytes > 0) == bool(p.flags & mod.PLAN_DW_SMEM), label
        if cluster in mod.RESIDENT_CLUSTERS:
            assert p.slots <= mod.RESIDENT_CLUSTERS[cluster] * int(g["ctas_per_sm"]), label
        # tail=peel: the vector path with a peeled head and tail, where N is no multiple of the vector; every slot
        # that runs several rows runs rows that start alike (slots * N a multiple of the vector)
        peel = bool(p.flags & mod.PLAN_PEEL)
        if peel:
            assert g["tail"] == "peel" and n % width and n > width, label
            assert m <= p.slots or p.slots * n % width == 0, label
        elif g["tail"] == "peel" and n % width and n > width:
            assert cluster == 16, label   # only where fewer slots than a period are resident
        narrow = bool(p.flags & mod.PLAN_NARROW)   # 2-element vectors: gene narrow, N even, not the vector path
        assert narrow == (bool(g.get("narrow")) and not peel and width > 2 and n % width != 0 and n % 2 == 0), label
        per = width if p.flags & (mod.PLAN_VECTOR | mod.PLAN_PEEL) else 2 if narrow else 1
        vectors = n // per
        if not p.flags & (mod.PLAN_DW_SMEM | mod.PLAN_DW_GLOBAL):   # all partials in registers: they must fit
            assert rows == 1 and g["dw_acc"] == "regs" and vectors <= int(g["reg_vecs"]) * threads * cluster, label
        if p.flags & mod.PLAN_DW_SMEM:   # one region per row group (per warp: sub-warp rows' PLAN_DW_WARP)
            vecs_per_thread = -(-vectors // (threads // rows * cluster))
            regions = threads // 32 if p.flags & mod.PLAN_DW_WARP else rows
            assert dw_bytes == regions * vecs_per_thread * per * (threads // rows) * 4, label
        assert p.dw_qx in (1, 2, 4, 8) and p.dw_width in (1, 4), label
        assert (p.dw_grid - 1) * p.dw_qx * p.dw_width < n <= p.dw_grid * p.dw_qx * p.dw_width, label


def test_peel_at_64_registers_takes_one_8_byte_register_vector_only():
    """Under 128 registers a thread (more than 512 threads an SM) tail=peel's second vector path fits one 8-byte
    register vector: the op's general genome in bf16 and fp32 has such a twin; one of 16 bytes, or two vectors,
    spill (tests/test_rmsnorm_bwd_sass.py compiles sampled genomes and checks no feasible one spills)."""
    general = genes(threads=512, reg_vecs=1, vec_bytes=8, load="plain", store="cs", tail="peel")
    assert mod.register_limit(general) == 64 and P.space.why_infeasible(general) is None
    for wider in (dict(vec_bytes=16), dict(reg_vecs=2)):
        why = P.space.why_infeasible({**general, **wider})
        assert why and "past one 8-byte register vector" in why and "reg_vecs=1 and vec_bytes=8" in why, why
    assert P.space.why_infeasible({**general, "ctas_per_sm": 1, "vec_bytes": 16}) is None   # 128 registers


def test_peeled_rows_of_a_slot_start_alike():
    """tail=peel, as the template runs it: slot s runs rows s, s + slots, ...; each must start the same hd elements
    before a vector boundary (the kernel traps otherwise), so that a thread's vectors are the same columns in each."""
    rng = random.Random()
    peeled = [genes(tail="peel"), genes(tail="peel", threads=512, cluster=8, ctas_per_sm=1, reg_vecs=2,
                                        prefetch=False, dw_acc="smem"),
              genes(tail="peel", small_m="grouped", vec_bytes=8), genes(tail="peel", small_m="direct")]
    seen = 0
    for _ in range(400):
        g, dtype = rng.choice(peeled), rng.choice(mod.problem.dtypes)
        m, n = rng.choice((1, 2, 7, 64, 263, 264, 265, 1000, 9000)), rng.randrange(9, 70000)
        p = mod.plan(g, m, n, dtype)
        vec = int(g["vec_bytes"]) // mod.DTYPE_BYTES[dtype]
        assert bool(p.flags & mod.PLAN_PEEL) == (n % vec != 0), (g, m, n, dtype)
        if not p.flags & mod.PLAN_PEEL:
            continue
        seen += 1
        for slot in range(p.slots):
            heads = {(vec - r * n % vec) % vec for r in range(slot, m, p.slots)}
            assert len(heads) <= 1, (g, m, n, dtype, slot, heads)
    assert seen > 100


def test_plans_pick_registers_shared_or_global_partials():
    regs, smem, glob = mod.PLAN_VECTOR, mod.PLAN_VECTOR | mod.PLAN_DW_SMEM, mod.PLAN_VECTOR | mod.PLAN_DW_GLOBAL
    d = mod.plan(DEFAULT, 32768, 4096, "bfloat16")   # 256 threads x 8 elements x 2 slots cover 4096
    assert d.flags == regs and d.shared_bytes == 0 and d.slots == mod.SMS * 2 and d.partial_rows == d.slots
    assert mod.plan(DEFAULT, 32768, 8192, "bfloat16").flags == smem
    assert mod.plan(DEFAULT, 32768, 8192, "bfloat16").shared_bytes == 8192 * 4
    wide = mod.plan(DEFAULT, 8192, 262144, "bfloat16")
    assert wide.flags == glob and wide.partial_rows == wide.slots
    warp_rows = mod.plan(genes(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem"),
                         3000, 40, "bfloat16")
    assert warp_rows.flags == smem and warp_rows.shared_bytes == 8 * 1 * 8 * 32 * 4
    big = genes(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", reduce="smem", prefetch=False)
    p = mod.plan(big, 8192, 262144, "bfloat16")
    assert p.flags == smem and p.shared_bytes == 4 * 8 * 1024 * 4 and p.slots == 15 and p.grid == 120
    g = genes(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")
    p = mod.plan(g, 8192, 262144, "bfloat16")
    assert p.flags == glob and p.slots == 32 and p.partial_rows == 256 == mod.scratch_rows(8192, 262144)
    # a whole row of 262144 on chip: 16 CTAs x 256 threads x 8 vectors, through a ring of two row slots
    whole = genes(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False)
    p = mod.plan(whole, 8192, 262144, "bfloat16")
    assert p.flags == regs and p.shared_bytes == 2 * 8 * 2 * 256 * 16 and p.slots == 7
    # dw partials in shared memory only where ctas_per_sm CTAs still fit on an SM (else a second wave)
    two = genes(threads=256, cluster=16, ctas_per_sm=2, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem")
    fits, over = mod.plan(two, 16384, 131072, "bfloat16"), mod.plan(two, 8192, 262144, "bfloat16")
    assert fits.flags == smem and 2 * (fits.shared_bytes + 2048) <= mod.SMEM_PER_SM
    assert over.flags == glob and over.shared_bytes == mod.ring_bytes(two) and over.slots == 14
    assert mod.plan(DEFAULT, 5, 33, "bfloat16").flags & mod.PLAN_VECTOR == 0
    assert mod.plan(DEFAULT, 5, 64, "bfloat16", aligned=False).flags & mod.PLAN_VECTOR == 0


@pytest.mark.parametrize("kw", [SPREAD[0], SPREAD[3]])
def test_launch_returns_both_kernels_with_typed_arguments(kw):
    g = genes(**kw)
    case = Case((17, 760), "bfloat16")
    inputs, outputs = P.make_inputs(case, 0, "cpu"), P.make_outputs(case, "cpu")
    assert outputs["dw_partial"].shape == (mod.scratch_rows(17, 760), 760) and set(P.reference(inputs)) < set(outputs)
    main, reduce = P.launch(g, case, inputs, outputs)
    assert isinstance(main, Launch) and isinstance(reduce, Launch)
    assert (main.kernel, reduce.kernel) == ("rmsnorm_bwd", "rmsnorm_bwd_dw")
    assert main.kernel in P.template() and reduce.kernel in P.template()
    p = mod.plan(g, 17, 760, "bfloat16")
    assert main.grid == (p.grid, 1, 1) and main.block == (int(g["threads"]), 1, 1)
    assert main.cluster == ((int(g["cluster"]), 1, 1) if int(g["cluster"]) > 1 else None)
    assert main.shared_bytes == p.shared_bytes and reduce.block == (mod.DW_THREADS, 1, 1)
    assert int(main.args[-2]) == p.slots and int(main.args[-1]) == p.flags and int(reduce.args[2]) == p.partial_rows
    for arg in main.args + reduce.args:
        assert isinstance(arg, (torch.Tensor, np.generic)), f"untyped kernel argument {arg!r}"
    # a misaligned view takes the element-at-a-time path
    shifted = dict(inputs, x=torch.empty(17 * 760 + 1, dtype=torch.bfloat16)[1:].view(17, 760))
    assert int(P.launch(g, case, shifted, outputs)[0].args[-1]) & mod.PLAN_VECTOR == 0
