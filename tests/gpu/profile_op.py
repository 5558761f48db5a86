"""Where one call of the exported op spends its host time (run on a GPU host): each layer of the call timed alone,
then cProfile's top entries. `python3 tests/gpu/profile_op.py` (prints a table; no file written)."""
import cProfile
import pstats
import time

import torch

from kernel_factory.kernels import rmsnorm as op

CALLS = 2000


def per_call_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e6 / CALLS


def main() -> None:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda")
    y, rstd = torch.empty_like(x), torch.empty(8, device="cuda")
    op.rmsnorm_fwd(x, w)
    index = torch.cuda.current_device()
    tensors = {"x": x, "w": w, "y": y, "rstd": rstd}
    launcher = op.FWD.launcher(index, "bfloat16", 8, 4096, 1e-6, tensors)
    stream = torch._C._cuda_getCurrentRawStream(index)
    fn, cfg, cfg_address, params, _, _, _ = launcher.steps[0]
    cfg.hStream = stream
    rows = {
        "rmsnorm_fwd (public API)": lambda: op.rmsnorm_fwd(x, w),
        "torch.ops.kernel_factory.rmsnorm_fwd": lambda: torch.ops.kernel_factory.rmsnorm_fwd(
            x, w, None, None, None, None, 1e-6, 0.0, False),
        "_fwd_impl (no dispatcher)": lambda: op._fwd_impl(x, w, None, None, None, None, 1e-6, 0.0, False),
        "_fwd_rows (allocs + launch)": lambda: op._fwd_rows(x, w, 1e-6, True),
        "Kernels.launcher lookup": lambda: op.FWD.launcher(index, "bfloat16", 8, 4096, 1e-6, tensors),
        "Launcher.launch": lambda: launcher.launch(stream, tensors),
        "cuLaunchKernelEx alone (ctypes)": lambda: launcher.driver.cuLaunchKernelEx(cfg_address, fn, params, None),
        "two torch.empty": lambda: (torch.empty_like(x), torch.empty(8, device="cuda")),
        "torch F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w.bfloat16(), 1e-6),
    }
    for name, fn_ in rows.items():
        print(f"{name:40s} {per_call_us(fn_):8.2f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        op.rmsnorm_fwd(x, w)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
