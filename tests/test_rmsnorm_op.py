"""The RMSNorm library op on CPU (its torch reference path): QuACK's API and semantics against torch autograd of the
fp32 formula, for every dtype of x, weight, residual and output, with bias, residual, prenorm, weight offset,
per-head weights, 3-D x, M = 1 and odd N; clear errors for bad input; the registered ops under opcheck and
torch.compile; the nn.RMSNorm drop-in; and the shipped tables, whose recipes and cubins need no GPU to check."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import json
import subprocess
import sys
import warnings

from kernel_factory.kernels import recipe, rmsnorm as op, runtime, table
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
    if res is not None:      # QuACK 0.6: residual_dtype when given, else the residual's dtype
        assert residual_out.dtype == (DT[res_arg] if res_arg else res.dtype)
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


@pytest.mark.parametrize("x_dt", ["bf16", "fp32"])
def test_weight_offset_is_gemma_style(x_dt):
    x, w, _, _ = tensors((5, 3, 40), DT[x_dt], torch.float32, seed=8, grad=True)
    out = op.rmsnorm(x, w, weight_offset=1.0)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    out.backward(dout)
    xr, wr = f64(x), f64(w)
    want = formula(xr, wr + 1.0)[0]
    want.backward(dout.double())
    close(out, want)
    close(x.grad, xr.grad, x.dtype)
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=1e-3 * (1 + wr.grad.abs().max().item()), rtol=1e-3)


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_per_head_weights_for_qk_norm(x_dt):
    """weight (H, D) on x (..., H, D): each head's rows use their own weight (q/k-norm)."""
    g = torch.Generator().manual_seed(10)
    x = (torch.randn(2, 3, 4, 32, generator=g) * 3).to(DT[x_dt]).requires_grad_(True)
    w = torch.randn(4, 32, generator=g).requires_grad_(True)
    b = torch.randn(4, 32, generator=g).requires_grad_(True)
    out = op.rmsnorm(x, w, b)
    dout = torch.randn(out.shape, generator=g).to(out.dtype)
    out.backward(dout)
    xr, wr, br = f64(x), f64(w), f64(b)
    want = formula(xr, wr, br)[0]
    want.backward(dout.double())
    close(out, want)
    close(x.grad, xr.grad, x.dtype)
    for got, ref in ((w, wr), (b, br)):
        torch.testing.assert_close(got.grad.double(), ref.grad, atol=0.05 * (1 + ref.grad.abs().max().item()),
                                   rtol=0.02)
    assert op.rmsnorm_fwd(x.detach(), w.detach(), store_rstd=True)[2].shape == (2, 3, 4)


@pytest.mark.parametrize("call,match", [
    (lambda x: op.rmsnorm_fwd(x, torch.ones(17)), r"Mismatched mW.shape\[0\]: weight has shape \(17,\); expected \(16,\)"),
    (lambda x: op.rmsnorm_fwd(x.to(torch.int32)), "Unsupported dtype: x is torch.int32"),
    (lambda x: op.rmsnorm_fwd(x.double()), "Unsupported dtype: x is torch.float64"),
    (lambda x: op.rmsnorm_fwd(x, torch.ones(16, dtype=torch.float64)), "Weight must be float32, float16 or bf"),
    (lambda x: op.rmsnorm_fwd(x, torch.ones(16, device="meta")), "weight is on meta but x is on cpu"),
    (lambda x: op.rmsnorm_fwd(x, residual=torch.ones(4, 15)), r"residual has shape \(4, 15\)"),
    (lambda x: op.rmsnorm_fwd(x, residual=torch.ones(4, 16, dtype=torch.int8)), "Residual must be float16"),
    (lambda x: op.rmsnorm_fwd(x, bias=torch.ones(2, 8)), r"bias has shape \(2, 8\)"),
    (lambda x: op.rmsnorm_fwd(x, out_dtype=torch.int8), "out_dtype=torch.int8 is not supported"),
    (lambda x: op.rmsnorm_fwd(x, eps=-1.0), "eps must be a number >= 0"),
    (lambda x: op.rmsnorm_fwd(x, weight_offset=1.0), "weight_offset requires a weight"),
    (lambda x: op.rmsnorm_fwd(x[:, :0]), "N > 0"),
    (lambda x: op.rmsnorm_fwd(x.numpy()), "x must be a torch.Tensor"),
    (lambda x: op.rmsnorm_bwd(x, None, x[:2], torch.ones(4)), r"dout must be a tensor of x's shape \(4, 16\)"),
    (lambda x: op.rmsnorm_bwd(x, None, x, torch.ones(3)), "rstd must be an fp32 tensor with one value per row"),
    (lambda x: op.rmsnorm_bwd(x, None, x, torch.ones(4, dtype=torch.float16)), "rstd must be an fp32 tensor"),
])
def test_bad_input_raises_a_clear_error(call, match):
    for kind in (ValueError, AssertionError):   # QuACK asserts; a ValueError is what a caller expects
        with pytest.raises(kind, match=match):
            call(torch.randn(4, 16))


def _paths(x_dt):
    """Every path of the forward op's schema: plain, weight offset, bias, residual, dtype overrides, per-head."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 40, generator=g).to(x_dt)
    w, b = torch.randn(40, generator=g), torch.randn(40, generator=g)
    res = torch.randn(6, 40, generator=g)
    xh, wh = torch.randn(3, 4, 16, generator=g).to(x_dt), torch.randn(4, 16, generator=g)
    return [(x, w, None, None, None, None, 1e-6, 0.0, False), (x, w, None, None, None, None, 1e-5, 1.0, False),
            (x, w, b, None, torch.float32, None, 1e-6, 0.0, False), (x, None, None, res, None, None, 1e-6, 0.0, True),
            (x, w, None, None, None, torch.float32, 1e-6, 0.0, True), (xh, wh, None, None, None, None, 1e-6, 0.0,
                                                                      False)]


@pytest.mark.parametrize("x_dt", [torch.bfloat16, torch.float16, torch.float32])
def test_opcheck_every_path(x_dt):
    for args in _paths(x_dt):
        grad = [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
        torch.library.opcheck(torch.ops.kernel_factory.rmsnorm_fwd.default, tuple(grad))
        x, w = args[0], args[1]
        _, _, rstd = torch.ops.kernel_factory.rmsnorm_fwd(*args)
        dout = torch.randn_like(x)
        torch.library.opcheck(torch.ops.kernel_factory.rmsnorm_bwd.default,
                              (x, w, dout, rstd, None, args[2] is not None, args[7]))


def test_compiled_fullgraph_forward_and_backward_with_dynamic_shapes():
    """torch.compile(fullgraph=True) traces the registered ops through their fake implementations: no graph break,
    and one compiled function serves 2-D and then 4-D inputs of other sizes."""
    torch._dynamo.reset()

    def f(x, w, res):
        out, res_out = op.rmsnorm(x, w, residual=res, prenorm=True, weight_offset=0.5)
        return out.float().square().sum() + res_out.float().sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for shape in [(8, 64), (2, 3, 5, 64), (3, 64), (4, 1, 7, 64)]:
        x, w, _, res = tensors(shape, torch.bfloat16, torch.float32, res_dt=torch.float32, seed=12, grad=True)
        compiled(x, w, res).backward()
        xr, wr, rr = (t.detach().clone().requires_grad_(True) for t in (x, w, res))
        f(xr, wr, rr).backward()
        for got, ref in ((x, xr), (w, wr), (res, rr)):
            torch.testing.assert_close(got.grad, ref.grad, atol=1e-2, rtol=1e-2)


def test_rmsnorm_module_is_a_drop_in_for_torch():
    ours, theirs = op.RMSNorm(48, eps=1e-5), torch.nn.RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(48, generator=torch.Generator().manual_seed(13)))
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    x = torch.randn(4, 7, 48, generator=torch.Generator().manual_seed(14))
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    two = op.RMSNorm((3, 16), elementwise_affine=False)     # several trailing dims, eps=None: torch's defaults
    y = torch.randn(5, 3, 16)
    torch.testing.assert_close(two(y), torch.nn.RMSNorm((3, 16), elementwise_affine=False)(y), atol=1e-5,
                               rtol=1e-5)


def test_cpu_runs_the_reference_and_says_so_once():
    op._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op.rmsnorm(torch.randn(3, 8))
        op.rmsnorm(torch.randn(3, 8))
    said = [str(w.message) for w in caught if "torch reference" in str(w.message)]
    assert len(said) == 1 and "tensors on cpu" in said[0]


def test_other_gpus_get_a_clear_answer(monkeypatch):
    """An sm_80 GPU: the sm_90a kernels' source uses clusters, so no JIT build; the reason names the GPU."""
    kernels = runtime.Kernels("rmsnorm_fwd")
    monkeypatch.setattr(kernels, "module", lambda kernel, index: None)
    why = kernels.why_not(0, "bfloat16", lambda index: (8, 0))
    assert "sm_80" in why and "does not compile for this GPU" in why
    assert kernels.why_not(1, "bfloat16", lambda index: (9, 0)) is None   # decided once per (device, dtype)


def test_the_op_imports_nothing_of_the_factory():
    code = ("import sys, kernel_factory.kernels.rmsnorm; "
            "print(sorted(m for m in sys.modules if m.startswith('kernel_factory.') and "
            "not m.startswith('kernel_factory.kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("problem", ["rmsnorm_fwd", "rmsnorm_bwd"])
def test_shipped_tables_are_self_contained(problem):
    """Every kernel the table can dispatch to has an intact cubin, a shipped source and a recipe that evaluates to a
    launch at random shapes: the op needs nothing else."""
    t = table.Table(runtime.OPS_DIR / f"{problem}.json")
    rng = np.random.default_rng(15)
    for dtype in t.dtypes():
        for n in [1, 7, 256, 4096, 4100, 7168, 262144]:
            kernel = t.kernel(dtype, int(n))
            assert kernel.cubin()[:4] == b"\x7fELF"
            assert "extern \"C\"" in kernel.source()
            for m in rng.integers(1, 70000, 4):
                plan = recipe.evaluate(kernel.recipe, int(m), int(n), 1e-6,
                                       {name: 256 for name in recipe.aligned_names(kernel.recipe)})
                for step in plan.steps:
                    assert step.grid >= 1 and step.grid % step.cluster == 0 and step.block % 32 == 0


def test_a_stale_cubin_is_refused(tmp_path):
    data = json.loads((runtime.OPS_DIR / "rmsnorm_fwd.json").read_text())
    (tmp_path / "t.json").write_text(json.dumps(data))
    kernel = table.Table(tmp_path / "t.json").kernel("bfloat16", 4096)
    kernel.cubin_path.parent.mkdir()
    kernel.cubin_path.write_bytes(b"\x7fELF not the built cubin")
    with pytest.raises(table.TableError, match="does not match its sha256"):
        kernel.cubin()


def test_recipes_say_what_they_cannot_evaluate():
    with pytest.raises(recipe.RecipeError, match="unknown recipe operation 'pow'"):
        recipe.value(["pow", 2, 3], {})
    with pytest.raises(recipe.RecipeError, match="recipe names 'K'"):
        recipe.value(["add", "K", 1], {"M": 1})
    assert recipe.value(["if", ["le", "M", 3], ["cdiv", "M", 2], ["div", 1, 0]], {"M": 3}) == 2
    assert [recipe.alignment(a) for a in (0, 1, 6, 8, 24, 4096)] == [16, 1, 2, 8, 8, 16]


def test_reference_functions_match_the_formula():
    x, w, b, res = tensors((5, 48), torch.bfloat16, torch.float32, torch.float32, torch.float32, seed=16)
    out, h = op.rmsnorm_ref(x, w, b, res, eps=1e-5, weight_offset=0.5)
    want, want_h, rstd = formula(x.double(), w.double() + 0.5, b.double(), res.double(), eps=1e-5)
    close(out, want)
    assert h.dtype == res.dtype
    torch.testing.assert_close(h.double(), want_h)
    g = torch.Generator().manual_seed(17)
    x2, dout = torch.randn(5, 48, generator=g), torch.randn(5, 48, generator=g)
    rstd2 = torch.rsqrt(x2.square().mean(dim=-1) + 1e-6)
    dx, dw = op.rmsnorm_bwd_ref(x2, w, dout, rstd2, weight_offset=0.5)
    xr, wr = f64(x2), f64(w)
    formula(xr, wr + 0.5)[0].backward(dout.double())
    torch.testing.assert_close(dx.double(), xr.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dw.double(), wr.grad, atol=1e-4, rtol=1e-4)
