"""The RMSNorm library op on CPU (its torch reference path): QuACK's API and semantics against torch autograd of the
fp32 formula, for every dtype of x, weight, residual and output, with bias, residual, prenorm, 3-D x, M = 1 and odd
N; clear errors for bad input; and the dispatch runtime's choices and JIT cache, which need no GPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_factory.evo.protocols import Launch, launch_steps
from kernel_factory.evo.types import Case, Genome
from kernel_factory.kernels import rmsnorm as op
from kernel_factory.kernels import runtime
from rmsnorm_formula import formula

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (atol, rtol) of a result rounded to the dtype, against an fp64 evaluation of the formula.
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-4, 1e-4)}




def close(got, want, dtype=None):
    atol, rtol = TOL[dtype or got.dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


def tensors(shape, x_dt, w_dt=None, b_dt=None, res_dt=None, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    make = lambda s, dt: (torch.randn(s, generator=g) * 2).to(dt).requires_grad_(grad) if dt else None  # noqa: E731
    return make(shape, x_dt), make((n,), w_dt), make((n,), b_dt), make(shape, res_dt)


def f64(t):
    return None if t is None else t.detach().double().requires_grad_(True)


SHAPES = [(4, 64), (1, 256), (3, 7), (2, 3, 33), (5, 1001)]


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("w_dt", ["fp32", "fp16", "bf16", None])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_the_formula(x_dt, w_dt, shape):
    x, w, _, _ = tensors(shape, DT[x_dt], DT.get(w_dt))
    out, residual_out, rstd = op.rmsnorm_fwd(x, w, store_rstd=True)
    want, _, want_rstd = formula(x.double(), w.double() if w is not None else None)
    assert out.dtype == x.dtype and out.shape == x.shape and residual_out is x
    close(out, want)
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    close(rstd, want_rstd, torch.float32)
    assert op.rmsnorm_fwd(x, w)[2] is None   # rstd only on request


@pytest.mark.parametrize("x_dt,res_dt,out_dt,res_arg", [
    ("bf16", "fp32", None, None), ("bf16", "bf16", "fp32", None), ("fp16", "fp32", "bf16", "fp16"),
    ("fp32", "bf16", "fp16", None), ("bf16", None, "fp32", "fp32"), ("fp16", None, None, "fp16")])
@pytest.mark.parametrize("with_bias", [False, True])
def test_residual_bias_and_dtypes_follow_quack(x_dt, res_dt, out_dt, res_arg, with_bias):
    x, w, b, res = tensors((2, 3, 48), DT[x_dt], torch.bfloat16, torch.float32 if with_bias else None,
                           DT.get(res_dt), seed=1)
    out, residual_out, rstd = op.rmsnorm_fwd(x, w, b, res, DT.get(out_dt), DT.get(res_arg), eps=1e-5)
    want, h, _ = formula(x.double(), w.double(), f64(b), f64(res), eps=1e-5)
    assert out.dtype == (DT.get(out_dt) or x.dtype) and rstd is None
    close(out, want)
    if res is not None:      # QuACK: residual_out takes the residual's dtype, whatever residual_dtype says
        assert residual_out.dtype == res.dtype
        close(residual_out, h)
    elif res_arg is not None and DT[res_arg] != x.dtype:
        assert residual_out.dtype == DT[res_arg] and residual_out is not x
        assert torch.equal(residual_out, x.to(DT[res_arg]))
    else:
        assert residual_out is x


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("w_dt", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(6, 40), (1, 129), (2, 3, 7)])
def test_autograd_grads_match_torch_autograd(x_dt, w_dt, shape):
    x, w, b, res = tensors(shape, DT[x_dt], DT[w_dt], DT[w_dt], torch.float32, seed=2, grad=True)
    out = op.rmsnorm(x, w, b, res, eps=1e-6)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype)
    out.backward(dout)
    xr, wr, br, rr = map(f64, (x, w, b, res))
    formula(xr, wr, br, rr)[0].backward(dout.double())
    for got, ref in ((x, xr), (w, wr), (b, br), (res, rr)):
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape
        # Gradients are reductions over the rows/columns: allow a few units of the dtype's rounding.
        atol, rtol = TOL[got.dtype]
        torch.testing.assert_close(got.grad.double(), ref.grad, atol=4 * atol * (1 + ref.grad.abs().max().item()),
                                   rtol=4 * rtol)


def test_no_weight_no_scaling_and_prenorm_gradient():
    x, _, _, res = tensors((5, 24), torch.float32, res_dt=torch.float32, seed=4, grad=True)
    out, residual_out = op.rmsnorm(x, None, None, res, prenorm=True)
    (out * 3 + residual_out.square()).sum().backward()
    xr, rr = f64(x), f64(res)
    y, h, _ = formula(xr, res=rr)
    (y * 3 + h.square()).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(res.grad.double(), rr.grad, atol=1e-4, rtol=1e-4)
    # without a residual, residual_out is x and its gradient still reaches x
    x2 = x.detach().clone().requires_grad_(True)
    out2, res_out2 = op.rmsnorm(x2, prenorm=True)
    (out2.sum() + res_out2.sum()).backward()
    xr2 = f64(x2)
    (formula(xr2)[0].sum() + xr2.sum()).backward()
    torch.testing.assert_close(x2.grad.double(), xr2.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_backward_api(x_dt):
    x, w, _, _ = tensors((7, 3, 50), DT[x_dt], torch.bfloat16, seed=5)
    _, _, rstd = op.rmsnorm_fwd(x, w, store_rstd=True)
    dout = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(x.dtype)
    dres_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(torch.float32)
    xr, wr = f64(x), f64(w)
    formula(xr, wr)[0].backward(dout.double())
    dx, dw, db, dres = op.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype and db.dtype == w.dtype and dres is None
    close(dx, xr.grad)
    torch.testing.assert_close(dw.double(), wr.grad, atol=0.05 * (1 + wr.grad.abs().max().item()), rtol=0.02)
    close(db, dout.double().sum(dim=(0, 1)), torch.bfloat16)
    dx2, dw2, db2, dres2 = op.rmsnorm_bwd(x, None, dout, rstd, dres_out, has_residual=True)
    assert dw2 is None and db2 is None
    xr2 = f64(x)
    formula(xr2)[0].backward(dout.double())
    close(dx2, xr2.grad + dres_out.double(), x.dtype)
    if x.dtype == torch.float32:
        assert dres2 is dx2                      # same dtype: dresidual is dx
    else:
        assert dres2.dtype == torch.float32      # dresidual_out's dtype
        close(dres2, xr2.grad + dres_out.double())
    assert op.rmsnorm_bwd(x, w, dout, rstd, has_residual=True)[3] is not None


def test_empty_batch_and_single_row():
    x = torch.randn(0, 16)
    out, _, rstd = op.rmsnorm_fwd(x, torch.ones(16), store_rstd=True)
    assert out.shape == (0, 16) and rstd.shape == (0,)
    one = torch.randn(1, 5000, dtype=torch.bfloat16)
    close(op.rmsnorm_fwd(one)[0], formula(one.double())[0])


@pytest.mark.parametrize("call,match", [
    (lambda x: op.rmsnorm_fwd(x, torch.ones(17)), r"weight has shape \(17,\), expected \(16,\)"),
    (lambda x: op.rmsnorm_fwd(x.to(torch.int32)), "x has dtype torch.int32; supported"),
    (lambda x: op.rmsnorm_fwd(x.double()), "x has dtype torch.float64"),
    (lambda x: op.rmsnorm_fwd(x, torch.ones(16, dtype=torch.float64)), "weight has dtype torch.float64"),
    (lambda x: op.rmsnorm_fwd(x, torch.ones(16, device="meta")), "weight is on meta but x is on cpu"),
    (lambda x: op.rmsnorm_fwd(x, residual=torch.ones(4, 15)), r"residual has shape \(4, 15\)"),
    (lambda x: op.rmsnorm_fwd(x, bias=torch.ones(2, 8)), r"bias has shape \(2, 8\)"),
    (lambda x: op.rmsnorm_fwd(x, out_dtype=torch.int8), "out_dtype=torch.int8 is not supported"),
    (lambda x: op.rmsnorm_fwd(x, eps=-1.0), "eps must be a finite number >= 0"),
    (lambda x: op.rmsnorm_fwd(x[:, :0]), "N > 0"),
    (lambda x: op.rmsnorm_fwd(x.numpy()), "x must be a torch.Tensor"),
    (lambda x: op.rmsnorm_bwd(x, None, x[:2], torch.ones(4)), r"dout has shape \(2, 16\)"),
    (lambda x: op.rmsnorm_bwd(x, None, x, torch.ones(3)), "rstd must be an fp32 tensor with one value per row"),
    (lambda x: op.rmsnorm_bwd(x, None, x, torch.ones(4, dtype=torch.float16)), "rstd must be an fp32 tensor"),
])
def test_bad_input_raises_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 16))


def test_cpu_and_other_gpus_use_the_reference():
    assert "not on a CUDA device" in runtime.why_not_gpu(torch.device("cpu"))
    runtime._CAPABILITY[99] = (8, 0)
    try:
        assert "sm_80" in runtime.why_not_gpu(torch.device("cuda", 99))
    finally:
        del runtime._CAPABILITY[99]


def test_dispatch_choices_from_the_shipped_table(rmsnorm):
    table = op.FWD.table
    assert table is not None, "kernels/ops/rmsnorm_fwd.json is missing: run `kernel-factory export ... --build`"
    def genes(entry):   # the table's genes; genes added to the space since the export take their defaults
        return table["genomes"][entry["genome"]]["genes"].items()

    genome, why = op.FWD.choose("bfloat16", 4096)
    assert why.startswith("N=4096") and genes(table["dtypes"]["bfloat16"]["by_n"]["4096"]) <= genome.gene_dict.items()
    genome, why = op.FWD.choose("bfloat16", 5120)
    assert why.startswith("general") and genes(table["dtypes"]["bfloat16"]["general"]) <= genome.gene_dict.items()
    genome, why = op.FWD.choose("float16", 5120)
    assert why.startswith("general") and genes(table["dtypes"]["float16"]["general"]) <= genome.gene_dict.items()
    assert genome != Genome.of(rmsnorm.space.defaults())


def test_prebuilt_cubins_are_used_while_they_match_the_template(tmp_path, monkeypatch, rmsnorm):
    from kernel_factory.evo.tools import dispatch
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kernels = runtime.Kernels("rmsnorm_fwd")
    genome, _ = kernels.choose("bfloat16", 4096)
    cubin = kernels.cubin(genome, "bfloat16")
    record = kernels.table["cubins"].get(f"{genome.id}:bfloat16")
    jitted = list(tmp_path.glob("kernel-factory/ops/*/*.cubin"))
    if record is not None and record["body_sha256"] == dispatch.body_sha256(rmsnorm, genome, "bfloat16"):
        assert cubin == (kernels.table_path.parent / record["file"]).read_bytes() and not jitted
    else:   # the template changed since the export (re-export with --build): compiled here instead
        assert [p.read_bytes() for p in jitted] == [cubin]


def test_missing_table_means_default_genome_and_jit_cache(tmp_path, monkeypatch, rmsnorm):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kernels = runtime.Kernels("rmsnorm_fwd", tmp_path / "nothing.json")
    genome, why = kernels.choose("bfloat16", 4096)
    assert genome == Genome.of(rmsnorm.space.defaults()) and why == "default genome (no dispatch table)"
    cubin = kernels.cubin(genome, "float32")
    assert cubin[:4] == b"\x7fELF"
    cached = list((tmp_path / "cache" / "kernel-factory" / "ops").glob("*/*.cubin"))
    assert len(cached) == 1 and cached[0].read_bytes() == cubin
    assert kernels.cubin(genome, "float32") == cubin      # from the cache this time


def test_missing_problem_plugin_is_reported_not_raised():
    missing = runtime.Kernels("no_such_problem")
    assert "does not load" in missing.unavailable()


def test_eps_reaches_the_launch_plan():
    step = Launch((1, 1, 1), (32, 1, 1), 0, ("x", np.int32(3), np.float32(1e-6)))
    plan, count = runtime.with_scalar((step, step), np.float32(1e-6), np.float32(1e-5))
    assert count == 2 and all(s.args[2] == np.float32(1e-5) and s.args[1] == 3 for s in plan)
    _, count = runtime.with_scalar(step, np.float32(1e-6), np.float32(1e-6))
    assert count == 1
    assert runtime.problem_constant(op.FWD.problem, "EPS") == 1e-6


class _Module:
    """A loaded cubin's stand-in: records what Prepared asks of it."""

    def __init__(self):
        self.shared, self.clusters, self.kernels = [], [], []

    def allow_shared(self, name, nbytes):
        self.shared.append((name, nbytes))

    def allow_cluster(self, name, cluster):
        self.clusters.append((name, cluster))

    def kernel(self, name):
        self.kernels.append(name)
        return f"kernel:{name}"


def test_prepared_launch_puts_each_calls_addresses_into_the_cached_plan():
    from kernel_factory.evo.evaluate.launcher import Prepared
    from kernel_factory.kernels.runtime import alignments
    from kernel_factory.problems.rmsnorm_bwd import problem as bwd

    def addresses(tensors):
        return {name: t.data_ptr() for name, t in tensors.items()}
    case = Case((300, 4096), "bfloat16")
    inputs, outputs = bwd.make_inputs(case, 1, "cpu"), bwd.make_outputs(case, "cpu")
    first = {**inputs, **outputs}
    genome = Genome.of(bwd.space.defaults())
    steps = launch_steps(bwd.launch(genome.gene_dict, case, inputs, outputs))
    module = _Module()
    prepared = Prepared(module, steps, {id(t): name for name, t in first.items()})
    assert [k for _, k, _, _ in prepared.steps] == ["kernel:rmsnorm_bwd", "kernel:rmsnorm_bwd_dw"]
    assert module.shared == [("rmsnorm_bwd", steps[0].shared_bytes), ("rmsnorm_bwd_dw", 0)]
    assert module.clusters == [("rmsnorm_bwd", None), ("rmsnorm_bwd_dw", None)]
    # Another call's tensors (same shape, new storage): their addresses, in the problem's argument order.
    again_in, again_out = bwd.make_inputs(case, 2, "cpu"), bwd.make_outputs(case, "cpu")
    tensors = {**again_in, **again_out}
    fresh = launch_steps(bwd.launch(genome.gene_dict, case, again_in, again_out))
    want = [[a.data_ptr() if hasattr(a, "data_ptr") else a for a in s.args] for s in fresh]
    assert prepared.arguments(addresses(tensors)) == want
    assert prepared.arguments(addresses(tensors))[0][0] != prepared.arguments(addresses(first))[0][0]
    assert prepared.arguments() == prepared.arguments(addresses(first))   # as prepared: the first call's tensors
    assert alignments(addresses(tensors)) == alignments(addresses(first))
    assert alignments(addresses({**tensors, "x": again_in["x"].view(-1)[1:]})) != alignments(addresses(tensors))


@pytest.fixture
def simulated_gpu(monkeypatch):
    """The kernel path on CPU: real dispatch choices and launch plans, with each launch replaced by the problem's
    reference written into the outputs (eps read back from the plan). Records (problem, case, steps) per launch."""
    launches = []

    def fake_run(self, case, inputs, outputs, scalars=None):
        genome, steps = self.plan(case, inputs, outputs, scalars)
        launches.append((self.problem_name, case, steps))
        if self.problem_name == "rmsnorm_fwd":
            eps = float(next(a for a in steps[0].args if isinstance(a, np.float32)))
            xf = inputs["x"].float()
            rstd = torch.rsqrt(xf.square().mean(dim=-1) + eps)
            want = {"y": xf * rstd[:, None] * inputs["w"], "rstd": rstd}
        else:
            want = self.problem.reference(inputs)
        for key, value in want.items():
            outputs[key].copy_(value)
        return genome

    monkeypatch.setattr(runtime, "why_not_gpu", lambda device: None)
    monkeypatch.setattr(runtime.Kernels, "run", fake_run)
    return launches


def test_kernel_path_plumbing(simulated_gpu):
    assert op.BWD.unavailable() is None, op.BWD.unavailable()
    x, w, b, res = tensors((2, 3, 40), torch.bfloat16, torch.bfloat16, torch.float32, torch.float32, seed=8,
                           grad=True)
    out = op.rmsnorm(x, w, eps=1e-5)                              # plain: the bf16 kernels on x
    out.backward(torch.ones_like(out))
    xr, wr = f64(x), f64(w)
    formula(xr, wr, eps=1e-5)[0].backward(torch.ones_like(xr))
    close(out, formula(x.double(), w.double(), eps=1e-5)[0])
    close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=0.05, rtol=0.02)
    assert [(p, c.dtype, c.shape) for p, c, _ in simulated_gpu] == [("rmsnorm_fwd", "bfloat16", (6, 40)),
                                                                   ("rmsnorm_bwd", "bfloat16", (6, 40))]
    scalars = [a for a in simulated_gpu[0][2][0].args if isinstance(a, np.float32)]
    assert scalars == [np.float32(1e-5)]                             # the caller's eps reached the launch
    assert [s.kernel for s in simulated_gpu[1][2]] == ["rmsnorm_bwd", "rmsnorm_bwd_dw"]
    simulated_gpu.clear()
    out, residual_out = op.rmsnorm(x, w, b, res, out_dtype=torch.float32, prenorm=True)   # the fp32 kernels on h
    (out.sum() + residual_out.sum()).backward()
    assert [(p, c.dtype) for p, c, _ in simulated_gpu] == [("rmsnorm_fwd", "float32"), ("rmsnorm_bwd", "float32")]
    close(out, formula(x.double(), w.double(), b.double(), res.double())[0], torch.float32)
