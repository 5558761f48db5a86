"""What `kernel-factory export --build` says about a problem's library op: the hand-written one (RMSNorm), the
generic op (kernels/op.py) when the recipes of the built table declare one, or what keeps the problem from one."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

HANDWRITTEN = {"rmsnorm_fwd": "kernel_factory.kernels.rmsnorm", "rmsnorm_bwd": "kernel_factory.kernels.rmsnorm"}


def op_line(problem: str, table: Mapping[str, Any], path: Path) -> str:
    """One line: how to load the op of the table just written, or why there is none."""
    if problem in HANDWRITTEN:
        return f"library op: {HANDWRITTEN[problem]} (written by hand; it reads kernels/ops/{problem}.json)"
    from ...kernels import op
    try:
        spec = op.spec_of(problem, table)
    except op.OpError as exc:
        return f"library op: none: {exc}"
    args = [*spec.inputs, *(f"{name}={value!r}" for name, value in spec.scalars)]
    return (f"library op: kernel_factory.kernels.op.load({problem!r}, {str(path)!r}) registers "
            f"torch.ops.kernel_factory.{problem}({', '.join(args)}) -> {', '.join(n for n, _ in spec.outputs)}")
