"""GPU tests of the RMSNorm library op (run on an H200: pytest -m gpu --gpu tests/gpu/test_rmsnorm_op_gpu.py): the
evolved kernels, chosen from the dispatch table, against the torch formula for every x dtype and weight dtype and
every path (plain, bias, residual, out_dtype, store_rstd, eps, autograd backward), on benchmark, held-out and odd
widths, M = 1, 3-D x and a side stream. The torch reference path is switched off, so a silent fallback fails."""
from __future__ import annotations

import pytest
import torch

from kernel_factory.kernels import rmsnorm as op
from rmsnorm_formula import formula

pytestmark = pytest.mark.gpu

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-4, 1e-4)}
SHAPES = [(64, 256), (64, 1024), (32, 4096), (16, 8192), (4, 65536), (2, 262144),   # benchmark widths
          (257, 2880), (257, 3584), (257, 5120), (257, 7168),                       # held-out model widths
          (1, 7168), (3, 1001), (5, 33), (7, 4100), (9, 7)]                          # M = 1 and odd N


@pytest.fixture(autouse=True)
def kernels_only(monkeypatch):
    """Every call must run the evolved kernels: the op's one-time warning that its reference runs raises here."""
    for kernels in (op.FWD, op.BWD):
        why = kernels.why_not(torch.cuda.current_device(), "bfloat16", torch.cuda.get_device_capability)
        assert why is None, why

    def refuse(message):
        raise AssertionError(f"the torch reference ran instead of a kernel: {message}")
    monkeypatch.setattr(op, "_warn_once", refuse)




def rand(shape, dtype, seed, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.pow(10.0, torch.rand(shape[:-1] + (1,), generator=g, device="cuda") * 4 - 2)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype).requires_grad_(grad)


def close(got, want, dtype=None):
    atol, rtol = TOL[dtype or got.dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("w_dt", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_plain_forward(x_dt, w_dt, shape):
    x, w = rand(shape, DT[x_dt], 1), torch.randn(shape[-1], device="cuda").to(DT[w_dt])
    out, residual_out, rstd = op.rmsnorm_fwd(x, w, store_rstd=True)
    want, _, want_rstd = formula(x.double(), w.double())
    assert out.dtype == x.dtype and residual_out is x
    close(out, want)
    close(rstd, want_rstd, torch.float32)
    assert op.FWD._modules and op.FWD._launchers, "no kernel was loaded"


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", [(8, 4096), (1, 7168), (3, 1001), (2, 5, 2880)], ids=str)
def test_bias_residual_out_dtype_and_eps(x_dt, shape):
    x, res = rand(shape, DT[x_dt], 2), rand(shape, torch.float32, 3)
    w, b = torch.randn(shape[-1], device="cuda").bfloat16(), torch.randn(shape[-1], device="cuda")
    out, residual_out, rstd = op.rmsnorm_fwd(x, w, b, res, out_dtype=torch.float32, eps=1e-5, store_rstd=True)
    want, h, want_rstd = formula(x.double(), w.double(), b.double(), res.double(), eps=1e-5)
    assert out.dtype == torch.float32 and residual_out.dtype == torch.float32 and rstd.shape == shape[:-1]
    close(out, want, torch.float32)
    close(residual_out, h, torch.float32)
    close(rstd, want_rstd, torch.float32)
    out16, res16, _ = op.rmsnorm_fwd(x, None, None, None, out_dtype=torch.float16, residual_dtype=torch.float32)
    close(out16, formula(x.double())[0])
    assert res16.dtype == torch.float32 and torch.equal(res16, x.float())


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("w_dt", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(64, 4096), (257, 5120), (1, 7168), (5, 1001), (2, 3, 2880)], ids=str)
def test_autograd_backward(x_dt, w_dt, shape):
    x = rand(shape, DT[x_dt], 4, grad=True)
    w = torch.randn(shape[-1], device="cuda").to(DT[w_dt]).requires_grad_(True)
    out = op.rmsnorm(x, w)
    dout = rand(shape, DT[x_dt], 5)
    out.backward(dout)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    formula(xr, wr)[0].backward(dout.double())
    assert x.grad.dtype == x.dtype and w.grad.dtype == w.dtype
    for got, ref in ((x.grad, xr.grad), (w.grad, wr.grad)):
        atol, rtol = TOL[got.dtype]
        torch.testing.assert_close(got.double(), ref, atol=atol * (1 + ref.abs().max().item()), rtol=rtol)


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_autograd_with_bias_residual_and_prenorm(x_dt):
    shape = (33, 3584)
    x, res = rand(shape, DT[x_dt], 6, grad=True), rand(shape, DT[x_dt], 7, grad=True)
    w = torch.randn(shape[-1], device="cuda", requires_grad=True)
    b = torch.randn(shape[-1], device="cuda", requires_grad=True)
    out, residual_out = op.rmsnorm(x, w, b, res, prenorm=True)
    (out.float().square().sum() + residual_out.float().sum()).backward()
    refs = [t.detach().double().requires_grad_(True) for t in (x, w, b, res)]
    y, h, _ = formula(*refs)
    (y.square().sum() + h.sum()).backward()
    for got, ref in zip((x, w, b, res), refs):
        atol, rtol = TOL[DT[x_dt]]
        torch.testing.assert_close(got.grad.double(), ref.grad, atol=atol * (1 + ref.grad.abs().max().item()),
                                   rtol=rtol)


def test_backward_runs_the_evolved_kernel():
    x, w = rand((64, 4096), torch.bfloat16, 8), torch.randn(4096, device="cuda")
    _, _, rstd = op.rmsnorm_fwd(x, w, store_rstd=True)
    dx, dw, _, _ = op.rmsnorm_bwd(x, w, rand((64, 4096), torch.bfloat16, 9), rstd)
    assert op.BWD._modules and dx.dtype == torch.bfloat16 and dw.dtype == torch.float32


def test_side_stream_and_second_call_reuse_the_module():
    x, w = rand((128, 4096), torch.bfloat16, 10), torch.randn(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = op.rmsnorm_fwd(x, w)[0]
        again = op.rmsnorm_fwd(x, w)[0]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    close(out, formula(x.double(), w.double())[0])
    assert torch.equal(out, again)
    kernel = op.FWD.table.kernel("bfloat16", 4096)
    assert (f"{kernel.genome}:bfloat16", torch.cuda.current_device()) in op.FWD._modules, kernel.why


@pytest.mark.parametrize("x_dt", ["bf16", "fp32"])
def test_cached_launch_takes_each_calls_tensors(x_dt):
    """The op prepares a launch once per (dtype, shape, alignment) and then only swaps addresses: new tensors of
    the same shape must be read and written, and a view off the 16-byte grid must get its own (scalar) plan."""
    shape, w = (96, 4096), torch.randn(4096, device="cuda")
    for seed in (11, 12, 13):
        x = rand(shape, DT[x_dt], seed)
        out, _, rstd = op.rmsnorm_fwd(x, w, store_rstd=True)
        want, _, want_rstd = formula(x.double(), w.double())
        close(out, want)
        close(rstd, want_rstd, torch.float32)
        dout = rand(shape, DT[x_dt], seed + 100)
        dx, dw, _, _ = op.rmsnorm_bwd(x, w, dout, rstd)
        xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
        formula(xr, wr)[0].backward(dout.double())
        torch.testing.assert_close(dx.double(), xr.grad, atol=TOL[DT[x_dt]][0] * (1 + xr.grad.abs().max().item()),
                                   rtol=TOL[DT[x_dt]][1])
        torch.testing.assert_close(dw.double(), wr.grad, atol=TOL[DT[x_dt]][0] * (1 + wr.grad.abs().max().item()),
                                   rtol=TOL[DT[x_dt]][1])
    flat = rand((shape[0] * shape[1] + 1,), DT[x_dt], 14)
    shifted = flat[1:].view(shape)          # one element past a 16-byte boundary
    assert shifted.data_ptr() % 16 != 0
    close(op.rmsnorm_fwd(shifted, w)[0], formula(shifted.double(), w.double())[0])


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_weight_offset_and_per_head(x_dt):
    x, w = rand((4, 8, 128), DT[x_dt], 15, grad=True), torch.randn(8, 128, device="cuda", requires_grad=True)
    out = op.rmsnorm(x, w, weight_offset=1.0)
    dout = rand(out.shape, DT[x_dt], 16)
    out.backward(dout)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    want = formula(xr, wr + 1.0)[0]
    want.backward(dout.double())
    close(out, want)
    atol, rtol = TOL[DT[x_dt]]
    for got, ref in ((x.grad, xr.grad), (w.grad, wr.grad)):
        torch.testing.assert_close(got.double(), ref, atol=atol * (1 + ref.abs().max().item()), rtol=rtol)


def test_compiled_module_and_cuda_graph():
    """The nn.RMSNorm drop-in under torch.compile(fullgraph=True), forward and backward, and a captured graph
    replayed on new inputs."""
    torch._dynamo.reset()
    norm = op.RMSNorm(4096, eps=1e-6, device="cuda")
    with torch.no_grad():
        norm.weight.copy_(torch.randn(4096, device="cuda"))
    compiled = torch.compile(norm, fullgraph=True, dynamic=True)
    for m in (1, 7, 64, 300):
        x = rand((m, 4096), torch.bfloat16, 17 + m, grad=True)
        out = compiled(x)
        out.float().sum().backward()
        xr = x.detach().double().requires_grad_(True)
        formula(xr, norm.weight.detach().double())[0].sum().backward()
        close(out, formula(x.double(), norm.weight.double())[0])
        atol, rtol = TOL[torch.bfloat16]
        torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol * (1 + xr.grad.abs().max().item()),
                                   rtol=rtol)
    static_x, w = rand((64, 4096), torch.bfloat16, 30), torch.randn(4096, device="cuda")
    op.rmsnorm_fwd(static_x, w)   # warm: plan and module made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = op.rmsnorm_fwd(static_x, w)[0]
    for seed in (31, 32):
        static_x.copy_(rand((64, 4096), torch.bfloat16, seed))
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(static_out, formula(static_x.double(), w.double())[0])
