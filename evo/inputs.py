"""Adversarial input rows for the correctness gate, for problem plugins to plant into their random inputs.

A kernel that is right on well-scaled random data can still overflow an fp16 accumulator on a row of huge values,
divide by zero on an all-zero row (the eps path), flush denormals, or turn the dtype's largest finite value into
NaN. Plugins import this module (like protocols and types) and call plant_special_rows from special_inputs().
"""
from __future__ import annotations

from typing import Any

# Rows planted, in this order, at random distinct positions (as many as the tensor has rows).
SPECIAL_ROWS = ("zero", "huge", "tiny", "denormal", "extremes")


def huge_magnitude(dtype: Any, n: int) -> float:
    """The largest magnitude whose squares still sum to a finite fp32 over n elements, within the dtype's range:
    an accumulator narrower than fp32 overflows here, a correct kernel does not."""
    import torch
    fp32_safe = (torch.finfo(torch.float32).max / (4.0 * max(n, 1))) ** 0.5
    return min(fp32_safe, torch.finfo(dtype).max / 2)


def special_row(kind: str, n: int, dtype: Any, gen: Any, device: str) -> Any:
    """One row of n values of `kind` (see SPECIAL_ROWS), random signs and spread, drawn from `gen`."""
    import torch
    info = torch.finfo(dtype)
    sign = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, -1.0, 1.0)
    spread = 1 + torch.rand(n, generator=gen, device=device)
    if kind == "zero":
        row = torch.zeros(n, device=device)
    elif kind == "huge":
        row = sign * spread * (huge_magnitude(dtype, n) / 2)
    elif kind == "tiny":
        row = sign * spread * info.tiny            # smallest normals: squares underflow, eps dominates
    elif kind == "denormal":
        row = sign * spread * info.smallest_normal / 64 if dtype != torch.float32 else sign * spread * 1e-42
    elif kind == "extremes":
        # The dtype's largest finite values: an fp32 sum of squares overflows to inf (the reference gives rstd 0
        # and y 0), mixed with its smallest subnormals.
        row = torch.where(torch.arange(n, device=device) % 2 == 0, sign * info.max, sign * info.smallest_normal / 8)
    else:
        raise ValueError(f"unknown special row {kind!r}; known: {', '.join(SPECIAL_ROWS)}")
    return row.to(dtype)


def plant_special_rows(x: Any, gen: Any) -> list[tuple[int, str]]:
    """Overwrite distinct random rows of the 2-D tensor x (in place) with the special rows; returns (row, kind)."""
    import torch
    m, n = x.shape
    rows = torch.randperm(m, generator=gen, device=x.device)[:len(SPECIAL_ROWS)].tolist()
    planted = []
    for row, kind in zip(rows, SPECIAL_ROWS):
        x[row] = special_row(kind, n, x.dtype, gen, str(x.device))
        planted.append((int(row), kind))
    return planted
