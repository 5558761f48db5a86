"""RMSNorm as a library op with QuACK's API (`rmsnorm_fwd`, `rmsnorm_bwd`, and `rmsnorm` with autograd), running the
factory's evolved kernels: `from kernel_factory.kernels.rmsnorm import rmsnorm`.

Semantics are QuACK's (quack/rmsnorm.py), for x of shape (..., N) in bf16/fp16/fp32:
- h = x + residual, in fp32 (no residual: h = x); rstd = 1 / sqrt(mean(h^2) + eps) per row;
  out = h * rstd * weight + bias in fp32, cast to out_dtype (default x.dtype). weight=None: no scaling.
- residual_out is h cast to residual_dtype. With a residual, residual_dtype is the residual's dtype (the argument is
  then ignored, as in QuACK). Without one, residual_out is x itself, unless residual_dtype names another dtype.
- rstd (fp32, shape x.shape[:-1]) is returned only with store_rstd=True.
- backward, with x_hat = x * rstd: dx = (w*dy - x_hat * mean(x_hat*w*dy)) * rstd (+ dresidual_out), in x's
  dtype; dw = sum over rows of dy*x_hat, in weight's dtype; db = sum over rows of dy (weight's dtype, fp32 without a
  weight); dresidual = dx in dresidual_out's dtype when that differs from x's, dx when has_residual, else None.
- `rmsnorm(..., prenorm=True)` also returns residual_out; its gradient flows back to x and the residual (also
  without a residual, where QuACK drops it).

Where it runs: on CUDA tensors of an sm_90 GPU the kernel comes from the dispatch table kernels/ops/<problem>.json
(exact N, else the dtype's general genome, else the problem's default genome; see kernels/runtime.py). The plain
case (no bias, no residual, out_dtype == x.dtype; backward: dout in x's dtype, no dresidual_out) runs the kernel of
x's dtype on x. Every other case runs the fp32 kernel on h and does the rest in torch: slower, same semantics. On CPU
tensors, on other GPUs, and while a backward problem plugin is missing, the same results come from a torch fp32
reference implementation (_forward_reference, _backward_reference), so the op is usable and testable everywhere.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from ..evo.types import Case
from . import runtime

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FWD = runtime.Kernels("rmsnorm_fwd")
BWD = runtime.Kernels("rmsnorm_bwd")
_warned: set[str] = set()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_tensor(name: str, t: Optional[Tensor], x: Tensor, shape: Optional[tuple] = None) -> None:
    """A clear ValueError for a tensor argument of the wrong type, dtype, shape or device."""
    if t is None:
        return
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {', '.join(map(str, DTYPES))}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} for x of shape {tuple(x.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}; put them on the same device")


def _check_x(x: Tensor) -> int:
    if not isinstance(x, Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; supported: {', '.join(map(str, DTYPES))}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have shape (..., N) with N > 0, got {tuple(x.shape)}")
    return x.shape[-1]


def _check_dtype(name: str, dtype: Optional[torch.dtype]) -> None:
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"{name}={dtype!r} is not supported; use one of {', '.join(map(str, DTYPES))} or None")


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _weight32(weight: Optional[Tensor], n: int, device: torch.device) -> Tensor:
    """The kernels take an fp32 weight of N elements; no weight is a weight of ones."""
    if weight is None:
        return torch.ones(n, dtype=torch.float32, device=device)
    return weight.to(torch.float32).contiguous()


def _forward_reference(h: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd) in fp32 for fp32 rows h (M, N): the torch reference the kernels are checked against."""
    rstd = torch.rsqrt(h.square().mean(dim=-1) + eps)
    y = h * rstd[:, None]
    return (y * weight.float() if weight is not None else y), rstd


def _forward_kernel(h: Tensor, w32: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y in h's dtype, rstd) from the evolved forward kernel for contiguous rows h (M, N)."""
    m, n = h.shape
    case = Case((m, n), _dtype_name(h.dtype))
    outputs = FWD.problem.make_outputs(case, str(h.device))
    if m > 0:
        eps_arg = np.float32(runtime.problem_constant(FWD.problem, "EPS", 1e-6))
        FWD.run(case, {"x": h, "w": w32}, outputs, {eps_arg: np.float32(eps)})
    return outputs["y"], outputs["rstd"]


def _rows_h(x2: Tensor, residual: Optional[Tensor], n: int) -> Tensor:
    """h = x + residual as fp32 rows (M, N)."""
    return x2.float() if residual is None else x2.float() + residual.reshape(-1, n).float()


def _forward_path(x: Tensor) -> str | None:
    """None when the forward kernel can run on x's device, else why the torch reference runs instead."""
    return runtime.why_not_gpu(x.device) or FWD.unavailable()


def rmsnorm_fwd(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                residual_dtype: Optional[torch.dtype] = None, eps: float = 1e-6,
                store_rstd: bool = False) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """RMSNorm forward: (out, residual_out, rstd or None); see the module docstring for the exact semantics."""
    n = _check_x(x)
    _check_tensor("weight", weight, x, (n,))
    _check_tensor("bias", bias, x, (n,))
    _check_tensor("residual", residual, x, tuple(x.shape))
    _check_dtype("out_dtype", out_dtype)
    _check_dtype("residual_dtype", residual_dtype)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    out_dtype = out_dtype or x.dtype
    if residual is not None:
        residual_dtype = residual.dtype
    keep_h = residual is not None or (residual_dtype is not None and residual_dtype != x.dtype)
    x2 = x.reshape(-1, n)
    plain = residual is None and bias is None and out_dtype == x.dtype
    on_gpu = _forward_path(x) is None
    # h (fp32 rows) is materialized only when something reads it: the plain kernel path reads x directly.
    h = None if plain and on_gpu and not keep_h else _rows_h(x2, residual, n)
    y = rstd = None
    if on_gpu:
        try:
            y, rstd = _forward_kernel(x2.contiguous() if plain else h.contiguous(), _weight32(weight, n, x.device),
                                      eps)
        except runtime.ScalarNotPassed as exc:
            _warn_once(f"rmsnorm: the torch reference runs instead: {exc}")
    if y is None:
        h = _rows_h(x2, residual, n) if h is None else h
        y, rstd = _forward_reference(h, weight, eps)
    if bias is not None:
        y = y.float() + bias.float()
    out = y.to(out_dtype).reshape(x.shape)
    residual_out = h.to(residual_dtype or x.dtype).reshape(x.shape) if keep_h else x
    return out, residual_out, (rstd.reshape(x.shape[:-1]) if store_rstd else None)


def _backward_reference(x2: Tensor, w32: Tensor, dy2: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx, dw) in fp32 for rows x2, dy2 (M, N), fp32 weight (N,) and rstd (M,): the torch reference."""
    r = rstd.float()[:, None]
    x_hat = x2.float() * r
    dy = dy2.float()
    wdy = dy * w32
    c = (x_hat * wdy).mean(dim=-1, keepdim=True)
    return (wdy - x_hat * c) * r, (dy * x_hat).sum(dim=0)


def _backward_kernel(x2: Tensor, w32: Tensor, dy2: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx in x2's dtype, dw fp32) from the evolved backward kernel (its plugin's launch plan, scratch included)."""
    m, n = x2.shape
    case = Case((m, n), _dtype_name(x2.dtype))
    outputs = BWD.problem.make_outputs(case, str(x2.device))
    if m == 0:
        return outputs["dx"], torch.zeros(n, dtype=torch.float32, device=x2.device)
    BWD.run(case, {"x": x2, "w": w32, "dy": dy2, "rstd": rstd}, outputs)
    return outputs["dx"], outputs["dw"]


def _backward_path(x: Tensor, kernel_dtype: torch.dtype) -> str | None:
    why = runtime.why_not_gpu(x.device) or BWD.unavailable()
    if why is None and _dtype_name(kernel_dtype) not in BWD.problem.dtypes:
        why = f"the backward problem has no {kernel_dtype} kernel"
    return why


def rmsnorm_bwd(x: Tensor, weight: Optional[Tensor], dout: Tensor, rstd: Tensor,
                dresidual_out: Optional[Tensor] = None, has_bias: bool = False,
                has_residual: bool = False) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """RMSNorm backward: (dx, dw, db, dresidual); see the module docstring for the exact semantics."""
    n = _check_x(x)
    _check_tensor("weight", weight, x, (n,))
    _check_tensor("dout", dout, x, tuple(x.shape))
    _check_tensor("dresidual_out", dresidual_out, x, tuple(x.shape))
    if not isinstance(rstd, Tensor) or rstd.dtype != torch.float32 or rstd.numel() != x.numel() // n:
        got = f"{rstd.dtype} with {rstd.numel()} elements" if isinstance(rstd, Tensor) else type(rstd).__name__
        raise ValueError(f"rstd must be an fp32 tensor with one value per row ({x.numel() // n}), got {got}")
    if rstd.device != x.device:
        raise ValueError(f"rstd is on {rstd.device} but x is on {x.device}; put them on the same device")
    x2, dy2, r = x.reshape(-1, n), dout.reshape(-1, n), rstd.reshape(-1).contiguous()
    w32 = _weight32(weight, n, x.device)
    plain = dout.dtype == x.dtype and dresidual_out is None
    kernel_dtype = x.dtype if plain else torch.float32
    if _backward_path(x, kernel_dtype) is None:
        dx, dw32 = _backward_kernel(x2.to(kernel_dtype).contiguous(), w32, dy2.to(kernel_dtype).contiguous(), r)
    else:
        dx, dw32 = _backward_reference(x2, w32, dy2, r)
    if dresidual_out is not None:
        dx = dx.float() + dresidual_out.reshape(-1, n).float()
    dx_out = dx.to(x.dtype).reshape(x.shape)
    dw = dw32.to(weight.dtype) if weight is not None else None
    db = dy2.float().sum(dim=0).to(weight.dtype if weight is not None else torch.float32) if has_bias else None
    if dresidual_out is not None and dresidual_out.dtype != x.dtype:
        dresidual = dx.to(dresidual_out.dtype).reshape(x.shape)
    else:
        dresidual = dx_out if has_residual else None
    return dx_out, dw, db, dresidual


class RMSNormFunction(torch.autograd.Function):
    """rmsnorm with autograd: the forward op, and rmsnorm_bwd for the gradients of x, weight, bias and residual."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm):
        out, residual_out, rstd = rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps,
                                              store_rstd=True)
        # As QuACK: the backward reads h as stored (residual_out) when there is a residual, else x.
        ctx.save_for_backward(residual_out if residual is not None else x, weight, rstd)
        ctx.has_bias, ctx.has_residual, ctx.prenorm = bias is not None, residual is not None, prenorm
        return (out, residual_out) if prenorm else out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, rstd = ctx.saved_tensors
        dresidual_out = rest[0] if ctx.prenorm and rest and rest[0] is not None else None
        dx, dw, db, dres = rmsnorm_bwd(x, weight, dout, rstd, dresidual_out, ctx.has_bias, ctx.has_residual)
        return dx, dw, db, dres, None, None, None, None


def rmsnorm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
            residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
            residual_dtype: Optional[torch.dtype] = None, eps: float = 1e-6, prenorm: bool = False):
    """RMSNorm with autograd over x (..., N): out, or (out, residual_out) with prenorm=True."""
    return RMSNormFunction.apply(x, weight, bias, residual, out_dtype, residual_dtype, eps, prenorm)
