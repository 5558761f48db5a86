"""RMSNorm as a PyTorch op with QuACK's API (0.6.x), running the factory's evolved kernels.

    from kernel_factory.kernels.rmsnorm import RMSNorm, rmsnorm, rmsnorm_fwd, rmsnorm_bwd

Forward and backward are registered with torch.library as `kernel_factory::rmsnorm_fwd` and
`kernel_factory::rmsnorm_bwd`, with fake implementations and autograd, so they work under torch.compile
(fullgraph, dynamic shapes) and CUDA graphs. Semantics are QuACK's, for x (..., N) in bf16/fp16/fp32:
- h = x + residual in fp32 (no residual: h = x); rstd = 1/sqrt(mean(h^2) + eps) per row;
  out = h * rstd * (weight + weight_offset) + bias in fp32, cast to out_dtype (default x.dtype).
- residual_out is h in residual_dtype (default: the residual's dtype, else x's); with neither a residual nor another
  residual_dtype it is x itself. rstd (fp32, x.shape[:-1]) is returned with store_rstd=True.
- Per-head weights: weight (H, D) on x (..., H, D) (q/k-norm); rows are normalized over D.
- backward: x_hat = h * rstd; dx = (w'*dy - x_hat * mean(x_hat*w'*dy)) * rstd (+ dresidual_out) with
  w' = weight + weight_offset; dw = sum over rows of dy*x_hat; db = sum over rows of dy.
Where it runs: on sm_90 the dispatch table's cubins (kernels/ops/); on another GPU the same genome JIT-built for it
when its source compiles there; otherwise, and on CPU tensors, a torch fp32 reference, with a one-time warning that
says why. The plain path (no bias, residual or per-head weight; out_dtype = x.dtype; backward: dout in x's dtype)
runs the kernel of x's dtype on x; the others run the fp32 kernel on h and do the rest in torch (slower, same
semantics; per-head backward uses the reference).
"""
from __future__ import annotations

import threading
import warnings
from typing import Optional

import torch
from torch import Tensor

from . import runtime

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FWD = runtime.Kernels("rmsnorm_fwd")
BWD = runtime.Kernels("rmsnorm_bwd")
_EMPTY = (0,)
_warned: set[str] = set()
_thread = threading.local()


class RMSNormInputError(ValueError, AssertionError):
    """Bad arguments. It is a ValueError, and an AssertionError as QuACK raises, so that either kind of check holds."""


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


_DTYPE_NAMES = {d: runtime.DTYPE_NAMES[str(d)] for d in DTYPES}


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES[dtype]


# ---- where a call runs -------------------------------------------------------------------------------------------

def _kernel_ok(kernels: runtime.Kernels, x: Tensor, dtype: torch.dtype) -> bool:
    """True when the exported kernel of dtype can run on x's device; else warns once why the reference runs."""
    if not x.is_cuda:
        why = f"tensors on {x.device.type}"
    else:
        why = kernels.why_not(x.get_device(), _DTYPE_NAMES[dtype], torch.cuda.get_device_capability)
        if why is None:
            return True
    _warn_once(f"kernel_factory rmsnorm: {kernels.problem} runs its torch reference ({why})")
    return False


def _launch(kernels: runtime.Kernels, m: int, n: int, dtype: torch.dtype, eps: float, tensors: dict) -> None:
    x = tensors["x"]
    index = x.get_device()
    if getattr(_thread, "device", None) != index:   # autograd's thread may have no driver context yet
        runtime._context(index)
        _thread.device = index
    launcher = kernels.launcher(index, _DTYPE_NAMES[dtype], m, n, eps, tensors)
    for name, (buf_dtype, shape) in launcher.buffers.items():
        tensors[name] = x.new_empty(shape, dtype=getattr(torch, buf_dtype))
    launcher.launch(torch._C._cuda_getCurrentRawStream(index), tensors)


def _fwd_rows(h: Tensor, w: Tensor, eps: float, kernel: bool) -> tuple[Tensor, Tensor]:
    """(y in h's dtype, rstd fp32) for contiguous rows h (M, N) and an fp32 weight w (N,)."""
    m, n = h.shape
    if not kernel:
        hf = h.float()
        rstd = torch.rsqrt(hf.square().mean(dim=-1) + eps)
        return (hf * rstd[:, None] * w).to(h.dtype), rstd
    y = torch.empty_like(h)
    rstd = h.new_empty((m,), dtype=torch.float32)
    if m:
        _launch(FWD, m, n, h.dtype, eps, {"x": h, "w": w, "y": y, "rstd": rstd})
    return y, rstd


def _bwd_rows(x: Tensor, w: Tensor, dy: Tensor, rstd: Tensor, kernel: bool) -> tuple[Tensor, Tensor]:
    """(dx in x's dtype, dw fp32) for contiguous rows x, dy (M, N), an fp32 weight w (N,) and rstd (M,)."""
    m, n = x.shape
    if not kernel or m == 0:
        xh = x.float() * rstd[:, None]
        g = dy.float() * w
        dx = (g - xh * (xh * g).mean(dim=-1, keepdim=True)) * rstd[:, None]
        return dx.to(x.dtype), (dy.float() * xh).sum(dim=0)
    dx = torch.empty_like(x)
    dw = torch.empty(n, dtype=torch.float32, device=x.device)
    _launch(BWD, m, n, x.dtype, 0.0, {"x": x, "w": w, "dy": dy, "rstd": rstd, "dx": dx, "dw": dw})
    return dx, dw


def _weight32(weight: Optional[Tensor], offset: float, n: int, device: torch.device) -> Tensor:
    if weight is None or weight.dim() == 2:
        return torch.ones(n, dtype=torch.float32, device=device)
    if weight.dtype is torch.float32 and not offset and weight.is_contiguous():
        return weight
    w = weight.float()
    return (w + offset if offset else w).contiguous()


# ---- the registered ops ------------------------------------------------------------------------------------------

_LIB = torch.library.Library("kernel_factory", "DEF")
_LIB.define("rmsnorm_fwd(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, ScalarType? out_dtype, "
            "ScalarType? residual_dtype, float eps, float weight_offset, bool keep_residual) "
            "-> (Tensor out, Tensor residual_out, Tensor rstd)")
_LIB.define("rmsnorm_bwd(Tensor x, Tensor? weight, Tensor dout, Tensor rstd, Tensor? dresidual_out, bool has_bias, "
            "float weight_offset) -> (Tensor dx, Tensor dw, Tensor db, Tensor dresidual)")


def _fwd_impl(x, weight, bias, residual, out_dtype, residual_dtype, eps, weight_offset, keep_residual,
              placeholder=True):
    """The forward op's implementation (any device). placeholder: an empty residual_out when none is kept, as the
    op's schema returns a tensor there (the eager fast path passes False and gets None)."""
    n = x.shape[-1]
    rows = x if x.dim() == 2 else x.reshape(-1, n)
    per_head = weight is not None and weight.dim() == 2
    plain = residual is None and bias is None and not per_head and (out_dtype is None or out_dtype == x.dtype)
    on_kernel = _kernel_ok(FWD, x, x.dtype if plain else torch.float32)
    w32 = _weight32(weight, weight_offset, n, x.device)
    if plain:
        y, rstd = _fwd_rows(rows if rows.is_contiguous() else rows.contiguous(), w32, eps, on_kernel)
        out = y if x.dim() == 2 else y.reshape(x.shape)
        residual_out = rows.float().to(residual_dtype or x.dtype, copy=True).reshape(x.shape) if keep_residual \
            else (x.new_empty(_EMPTY) if placeholder else None)
        return out, residual_out, (rstd if x.dim() == 2 else rstd.reshape(x.shape[:-1]))
    h = rows.float() if residual is None else rows.float() + residual.reshape(-1, n).float()
    y, rstd = _fwd_rows(h.contiguous(), w32, eps, on_kernel)
    if per_head:
        y = (y.reshape(x.shape) * (weight.float() + weight_offset)).reshape(-1, n)
    if bias is not None:
        y = (y.reshape(x.shape) + bias.float()).reshape(-1, n)
    out = y.to(out_dtype or x.dtype).reshape(x.shape)
    residual_out = h.to(residual_dtype or x.dtype, copy=True).reshape(x.shape) if keep_residual \
        else (x.new_empty(_EMPTY) if placeholder else None)
    return out, residual_out, rstd.reshape(x.shape[:-1])


def _bwd_impl(x, weight, dout, rstd, dresidual_out, has_bias, weight_offset):
    n = x.shape[-1]
    per_head = weight is not None and weight.dim() == 2
    x2, dy2, r = x.reshape(-1, n), dout.reshape(-1, n), rstd.reshape(-1).float().contiguous()
    plain = dout.dtype == x.dtype and dresidual_out is None and not per_head
    if per_head:   # rows of head h use weight[h]: the reference computes it (no per-head kernel yet)
        w = (weight.float() + weight_offset)
        xh = x.float() * rstd.float()[..., None]
        g = dout.float() * w
        dx = (g - xh * (xh * g).mean(dim=-1, keepdim=True)) * rstd.float()[..., None]
        dx, dw32 = dx.reshape(-1, n), (dout.float() * xh).reshape(-1, *weight.shape).sum(dim=0)
    else:
        kernel_dtype = x.dtype if plain else torch.float32
        on_kernel = _kernel_ok(BWD, x, kernel_dtype)
        dx, dw32 = _bwd_rows(x2.to(kernel_dtype).contiguous(), _weight32(weight, weight_offset, n, x.device),
                             dy2.to(kernel_dtype).contiguous(), r, on_kernel)
    if dresidual_out is not None:
        dx = dx.float() + dresidual_out.reshape(-1, n).float()
    dx_out = dx.to(x.dtype).reshape(x.shape)
    dw = dw32.to(weight.dtype) if weight is not None else x.new_empty(_EMPTY)
    db_dtype = weight.dtype if weight is not None else torch.float32
    db = dout.float().reshape(-1, *((weight.shape) if per_head else (n,))).sum(dim=0).to(db_dtype) \
        if has_bias else x.new_empty(_EMPTY)
    separate = dresidual_out is not None and dresidual_out.dtype != x.dtype
    dresidual = dx.to(dresidual_out.dtype).reshape(x.shape) if separate else x.new_empty(_EMPTY)
    return dx_out, dw, db, dresidual


for _device in ("CUDA", "CPU"):
    _LIB.impl("rmsnorm_fwd", _fwd_impl, _device)
    _LIB.impl("rmsnorm_bwd", _bwd_impl, _device)


@torch.library.register_fake("kernel_factory::rmsnorm_fwd")
def _fwd_fake(x, weight, bias, residual, out_dtype, residual_dtype, eps, weight_offset, keep_residual):
    out = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    residual_out = x.new_empty(x.shape, dtype=residual_dtype or x.dtype) if keep_residual else x.new_empty(_EMPTY)
    return out, residual_out, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("kernel_factory::rmsnorm_bwd")
def _bwd_fake(x, weight, dout, rstd, dresidual_out, has_bias, weight_offset):
    dw = torch.empty_like(weight) if weight is not None else x.new_empty(_EMPTY)
    db_shape = weight.shape if weight is not None else x.shape[-1:]
    db = x.new_empty(db_shape, dtype=weight.dtype if weight is not None else torch.float32) if has_bias \
        else x.new_empty(_EMPTY)
    separate = dresidual_out is not None and dresidual_out.dtype != x.dtype
    dresidual = x.new_empty(x.shape, dtype=dresidual_out.dtype) if separate else x.new_empty(_EMPTY)
    return x.new_empty(x.shape), dw, db, dresidual


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, _, _, _, weight_offset, keep_residual = inputs
    _, residual_out, rstd = output
    # As QuACK: the backward reads h as stored (residual_out) when there is a residual, else x.
    ctx.save_for_backward(residual_out if residual is not None else x, weight, rstd)
    ctx.has_bias, ctx.has_residual, ctx.keep_residual = bias is not None, residual is not None, keep_residual
    ctx.weight_offset = weight_offset
    ctx.x_dtype, ctx.residual_dtype = x.dtype, residual.dtype if residual is not None else None


def _backward(ctx, dout, dresidual_out, _drstd, backward=None):
    """The gradients of the forward op's inputs; `backward` is the backward op (the registered one by default; the
    eager path passes its implementation directly)."""
    h, weight, rstd = ctx.saved_tensors
    if not ctx.keep_residual:
        dresidual_out = None
    dx, dw, db, dres = (backward or torch.ops.kernel_factory.rmsnorm_bwd)(
        h, weight, dout.contiguous(), rstd, dresidual_out, ctx.has_bias, ctx.weight_offset)
    dresidual = None
    if ctx.has_residual:   # as QuACK: the gradient in the stored h's precision, not rounded to x's dtype first
        dresidual = (dres if dres.numel() else dx).to(ctx.residual_dtype)
    return (dx.to(ctx.x_dtype), dw if weight is not None else None, db if ctx.has_bias else None, dresidual,
            None, None, None, None, None)


torch.library.register_autograd("kernel_factory::rmsnorm_fwd", _backward, setup_context=_setup_context)


class _EagerRMSNorm(torch.autograd.Function):
    """The same forward and backward outside torch.compile, without a trip through the dispatcher (which costs
    tens of microseconds per call in Python): torch.compile traces the registered op instead."""

    @staticmethod
    def forward(ctx, *args):
        out, residual_out, rstd = _fwd_impl(*args)
        _setup_context(ctx, args, (out, residual_out, rstd))
        ctx.mark_non_differentiable(rstd)
        return out, residual_out, rstd

    @staticmethod
    def backward(ctx, dout, dresidual_out, drstd):
        return _backward(ctx, dout, dresidual_out, drstd, backward=_bwd_impl)


def _forward(*args) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The forward op: traced under torch.compile, with autograd when an input needs a gradient, else the
    implementation itself (an inference call pays only the launch)."""
    if torch.compiler.is_compiling():
        return torch.ops.kernel_factory.rmsnorm_fwd(*args)
    x, weight, bias, residual = args[:4]
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                    or (bias is not None and bias.requires_grad)
                                    or (residual is not None and residual.requires_grad)):
        return _EagerRMSNorm.apply(*args)
    return _fwd_impl(*args, placeholder=False)


# ---- QuACK's public API ------------------------------------------------------------------------------------------

def _fail(message: str) -> None:
    raise RMSNormInputError(message)


def _check_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, weight_offset) -> None:
    if not isinstance(x, Tensor):
        _fail(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        _fail(f"Unsupported dtype: x is {x.dtype}; supported: bfloat16, float16, float32")
    if x.dim() < 1 or x.shape[-1] == 0:
        _fail(f"x must have shape (..., N) with N > 0, got {tuple(x.shape)}")
    per_head = (weight is not None and weight.dim() == 2) or (bias is not None and bias.dim() == 2)
    want = tuple(x.shape[-2:]) if per_head else (x.shape[-1],)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.dtype not in DTYPES:
            _fail(f"Weight must be float32, float16 or bfloat16: {name} is "
                  f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")
        if tuple(t.shape) != want:
            _fail(f"Mismatched mW.shape[0]: {name} has shape {tuple(t.shape)}; expected {want} for x of shape "
                  f"{tuple(x.shape)}"
                  + (" (per-head weights are (H, D) on x (..., H, D))" if per_head else ""))
        if t.get_device() != x.get_device() or t.is_meta != x.is_meta:   # ints: cheaper than device objects
            _fail(f"{name} is on {t.device} but x is on {x.device}; put them on the same device")
    if residual is not None:
        if not isinstance(residual, Tensor) or residual.dtype not in DTYPES:
            _fail("Residual must be float16, bfloat16, or float32")
        if residual.shape != x.shape or residual.get_device() != x.get_device():
            _fail(f"residual has shape {tuple(residual.shape)} on {residual.device}; expected x's "
                  f"{tuple(x.shape)} on {x.device}")
    for name, dt in (("out_dtype", out_dtype), ("residual_dtype", residual_dtype)):
        if dt is not None and dt not in DTYPES:
            _fail(f"{name}={dt!r} is not supported; use bfloat16, float16, float32 or None")
    if not isinstance(eps, (int, float)) or eps < 0 or eps != eps:
        _fail(f"eps must be a number >= 0, got {eps!r}")
    if weight_offset != 0.0 and weight is None:
        _fail("weight_offset requires a weight")


def rmsnorm_fwd(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                residual_dtype: Optional[torch.dtype] = None, eps: float = 1e-6, store_rstd: bool = False,
                weight_offset: float = 0.0) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """RMSNorm forward: (out, residual_out, rstd or None); see the module docstring for the semantics."""
    _check_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, weight_offset)
    if residual is not None and residual_dtype is None:
        residual_dtype = residual.dtype
    keep = residual is not None or (residual_dtype is not None and residual_dtype != x.dtype)
    out, residual_out, rstd = _forward(x, weight, bias, residual, out_dtype, residual_dtype, float(eps),
                                       float(weight_offset), keep)
    return out, (residual_out if keep else x), (rstd if store_rstd else None)


def rmsnorm_bwd(x: Tensor, weight: Optional[Tensor], dout: Tensor, rstd: Tensor,
                dresidual_out: Optional[Tensor] = None, has_bias: bool = False, has_residual: bool = False,
                weight_offset: float = 0.0) -> tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """RMSNorm backward: (dx, dw, db, dresidual); see the module docstring for the semantics."""
    _check_fwd(x, weight, None, None, None, None, 0.0, weight_offset)
    if not isinstance(dout, Tensor) or dout.shape != x.shape or dout.dtype not in DTYPES:
        _fail(f"dout must be a tensor of x's shape {tuple(x.shape)} in bf16/fp16/fp32")
    rows = x.shape[:-1]
    if not isinstance(rstd, Tensor) or rstd.dtype != torch.float32 or rstd.numel() != rows.numel():
        got = f"{rstd.dtype} with {rstd.numel()} elements" if isinstance(rstd, Tensor) else type(rstd).__name__
        _fail(f"rstd must be an fp32 tensor with one value per row ({rows.numel()}), got {got}")
    if dresidual_out is not None and (dresidual_out.shape != x.shape or dresidual_out.dtype not in DTYPES):
        _fail("Residual must be float16, bfloat16, or float32, of x's shape")
    backward = torch.ops.kernel_factory.rmsnorm_bwd if torch.compiler.is_compiling() else _bwd_impl
    dx, dw, db, dres = backward(x, weight, dout, rstd.reshape(rows), dresidual_out, has_bias, float(weight_offset))
    dresidual = dres if dres.numel() or (dresidual_out is not None and dresidual_out.dtype != x.dtype) else None
    if has_residual and dresidual is None:
        dresidual = dx
    return dx, (dw if weight is not None else None), (db if has_bias else None), dresidual


def rmsnorm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
            residual: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None,
            residual_dtype: Optional[torch.dtype] = None, eps: float = 1e-6, prenorm: bool = False,
            weight_offset: float = 0.0):
    """RMSNorm with autograd over x (..., N): out, or (out, residual_out) with prenorm=True."""
    out, residual_out, _ = rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, False,
                                       weight_offset)
    return (out, residual_out) if prenorm else out


def rmsnorm_ref(x: Tensor, w: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                residual: Optional[Tensor] = None, eps: float = 1e-6, weight_offset: float = 0.0):
    """The formula in fp32 torch (QuACK's reference's contract): out in x's dtype, and (out, h in the residual's
    dtype) when a residual is given. Differentiable; for checking the op."""
    h = x.float() if residual is None else x.float() + residual.float()
    out = h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
    if w is not None:
        out = out * (w.float() + weight_offset)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype) if residual is None else (out.to(x.dtype), h.to(residual.dtype))


def rmsnorm_bwd_ref(x: Tensor, w: Optional[Tensor], dout: Tensor, rstd: Tensor, eps: float = 1e-6,
                    weight_offset: float = 0.0) -> tuple[Tensor, Optional[Tensor]]:
    """The backward formula in fp32 torch for rows x (M, N): (dx in x's dtype, dw in w's dtype or None)."""
    x_hat = x.float() * rstd.float().unsqueeze(-1)
    g = dout.float() * (w.float() + weight_offset) if w is not None else dout.float()
    dx = (g - x_hat * (x_hat * g).mean(dim=-1, keepdim=True)) * rstd.float().unsqueeze(-1)
    dw = (dout.float() * x_hat).sum(dim=0).to(w.dtype) if w is not None else None
    return dx.to(x.dtype), dw


class RMSNorm(torch.nn.RMSNorm):
    """A drop-in for torch.nn.RMSNorm (same constructor, parameters and state dict) that runs this op.

    As torch.nn.RMSNorm, eps=None means torch.finfo(x.dtype).eps, and normalized_shape may name several trailing
    dimensions (they are normalized together as one row)."""

    def forward(self, x: Tensor) -> Tensor:
        dims = len(self.normalized_shape)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        if dims == 1:
            return rmsnorm(x, self.weight, eps=eps)
        rows = x.reshape(*x.shape[:-dims], -1)
        weight = self.weight.reshape(-1) if self.weight is not None else None
        return rmsnorm(rows, weight, eps=eps).reshape(x.shape)
