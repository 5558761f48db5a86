"""What first-call tuning costs (kernels/tune.py): per shape and dtype, the wall time of the op's first call (it times
every kernel of the dtype), of the next call, and of a first call with tuning off (the rule's pick: module load and
plan only), forward and backward, each from kernels that have seen nothing yet and an empty choices folder.

    python3 tests/gpu/tune_cost.py            (on a GPU host; prints a table)
"""
from __future__ import annotations

import os
import tempfile
import time

import torch

from kernel_factory.kernels import rmsnorm as op
from kernel_factory.kernels import runtime, tune

SHAPES = [(1, 4096), (7, 7168), (4096, 4096), (32768, 8192), (8192, 262144)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def wall(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def fresh() -> None:
    op.FWD, op.BWD = runtime.Kernels("rmsnorm_fwd"), runtime.Kernels("rmsnorm_bwd")


def main() -> None:
    os.environ["KF_TUNE_CACHE"] = tempfile.mkdtemp(prefix="kf-tune-cost-")
    print(f"{torch.cuda.get_device_name()}; ms of wall time per call, synchronized")
    print("| dtype | shape | part | kernels timed | first call, tuned | next call | first call, rule only |")
    print("|---|---|---|---|---|---|---|")
    for name, dtype in DTYPES.items():
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda").to(dtype)
            w, dy = torch.randn(n, device="cuda"), torch.randn(m, n, device="cuda").to(dtype)
            rstd = torch.rand(m, device="cuda") + 0.5
            calls = {"fwd": lambda: op.rmsnorm_fwd(x, w), "bwd": lambda: op.rmsnorm_bwd(x, w, dy, rstd)}
            for part, call in calls.items():
                kernels = {"fwd": "FWD", "bwd": "BWD"}[part]
                fresh()
                with tune.rule_only():
                    rule = wall(call)
                fresh()
                first, then = wall(call), wall(call)
                count = len(getattr(op, kernels).table.kernels_of(runtime.DTYPE_NAMES[str(dtype)]))
                print(f"| {name} | {m}x{n} | {part} | {count} | {first:.1f} | {then:.2f} | {rule:.1f} |", flush=True)
            del x, w, dy, rstd


if __name__ == "__main__":
    main()
