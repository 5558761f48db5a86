"""GPU test of every kernel the RMSNorm op may run: first-call tuning (kernels/tune.py) times the rule's pick and every
tuning candidate of the table in the call's region and keeps the fastest without checking its outputs, so each of
them must be right on every shape it may meet. Each kernel is launched through the op's own launch path (recipe,
alignment, scratch buffers) on fresh random inputs with its outputs poisoned (NaN), and compared with the formula in
fp64, forward and backward, in every dtype, on shapes that the campaigns did not train on: M = 1, tiny and odd N,
small M with wide rows. Run it after installing a table (tests/gpu/campaigns.sh installs twinned and widened ones)."""
from __future__ import annotations

import pytest
import torch

from kernel_factory.kernels import rmsnorm as op
from kernel_factory.kernels import runtime

pytestmark = pytest.mark.gpu

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-4}
SHAPES = [(1, 7168), (3, 33), (5, 100), (19, 4100), (64, 5001), (257, 1030), (301, 2880), (1000, 256),
          (4099, 96), (2, 30001), (6, 131072), (33, 12290)]
EPS = 1e-6


def rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.pow(10.0, torch.rand(shape[:-1] + (1,), generator=g, device="cuda") * 4 - 2)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)


def run(kernels: runtime.Kernels, kernel, dtype: str, m: int, n: int, tensors: dict) -> None:
    index = torch.cuda.current_device()
    runtime._context(index)   # as the op's launch does before its first kernel on a thread
    launch = kernels._runner(index, kernel, dtype, m, n, EPS, tensors)
    launch()
    torch.cuda.synchronize()


def close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert torch.isfinite(got).all(), f"{what}: NaN or inf (a poisoned output left unwritten?)"
    torch.testing.assert_close(got.double(), want, atol=tol * (1 + want.abs().max().item()), rtol=tol, msg=lambda m:
                               f"{what}: {m}")


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_every_forward_kernel_in_reach_is_right(x_dt):
    dtype, name = DT[x_dt], runtime.DTYPE_NAMES[str(DT[x_dt])]
    checked = 0
    for seed, (m, n) in enumerate(SHAPES):
        x, w = rand((m, n), dtype, seed), torch.randn(n, device="cuda", dtype=torch.float32)
        xd = x.double()
        rstd = torch.rsqrt(xd.square().mean(-1) + EPS)
        want = xd * rstd[:, None] * w.double()
        for kernel in op.FWD.in_reach(name, m, n).values():
            y = torch.full_like(x, float("nan"))
            r = torch.full((m,), float("nan"), device="cuda")
            run(op.FWD, kernel, name, m, n, {"x": x, "w": w, "y": y, "rstd": r})
            what = f"fwd {kernel.genome} {x_dt} {m}x{n}"
            close(y, want, TOL[dtype], what)
            close(r, rstd, 1e-4, what + " rstd")
            checked += 1
    assert checked >= len(SHAPES)


@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_every_backward_kernel_in_reach_is_right(x_dt):
    dtype, name = DT[x_dt], runtime.DTYPE_NAMES[str(DT[x_dt])]
    checked = 0
    for seed, (m, n) in enumerate(SHAPES):
        x, dy = rand((m, n), dtype, 2 * seed), rand((m, n), dtype, 2 * seed + 1)
        w = torch.randn(n, device="cuda", dtype=torch.float32)
        rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
        xh = x.double() * rstd.double()[:, None]
        g = dy.double() * w.double()
        want_dx = (g - xh * (xh * g).mean(-1, keepdim=True)) * rstd.double()[:, None]
        want_dw = (dy.double() * xh).sum(0)
        for kernel in op.BWD.in_reach(name, m, n).values():
            dx = torch.full_like(x, float("nan"))
            dw = torch.full((n,), float("nan"), device="cuda")
            run(op.BWD, kernel, name, m, n, {"x": x, "w": w, "dy": dy, "rstd": rstd, "dx": dx, "dw": dw})
            what = f"bwd {kernel.genome} {x_dt} {m}x{n}"
            close(dx, want_dx, TOL[dtype], what + " dx")
            close(dw, want_dw, TOL[dtype], what + " dw")
            checked += 1
    assert checked >= len(SHAPES)
