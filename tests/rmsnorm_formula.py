"""The RMSNorm formula the library op's CPU and GPU tests compare against (imported by both)."""
import torch


def formula(x, w=None, b=None, res=None, eps=1e-6):
    """The RMSNorm formula in whatever precision its arguments have (fp64 in the tests): (out, h, rstd)."""
    h = x if res is None else x + res
    rstd = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
    y = h * rstd
    y = y * w if w is not None else y
    return (y + b if b is not None else y), h, rstd.squeeze(-1)
