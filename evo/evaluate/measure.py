"""Device-side checking and timing, shared by the GPU worker and the bench command: compare outputs with the
reference, time a launch with CUDA events around each call and an L2 flush before it, and describe the machine.
Only torch and the standard library; runs wherever torch runs (the comparisons are tested on the CPU)."""
from __future__ import annotations

import datetime
import math
import platform
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Mapping

FLUSH_BYTES = 256 * 2**20   # more than the H200's 60 MB L2: a flush before each timed call leaves it cold


def mismatch(out: Any, ref: Any, atol: float, rtol: float, label: str) -> str | None:
    """None when `out` matches `ref` within |out - ref| <= atol + rtol * |ref| everywhere; else a short summary.
    NaN and Inf never pass, and a shape mismatch is reported as such."""
    import torch
    if tuple(out.shape) != tuple(ref.shape):
        return f"{label}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.float(), ref.float()
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = tuple(int(i) for i in torch.nonzero(~finite)[0])
        return f"{label}: {bad} non-finite values, first at {first}"
    err = (o - r).abs()
    over = err > atol + rtol * r.abs()
    if bool(over.any()):
        worst = int(torch.argmax(err - rtol * r.abs()))
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), o.shape))
        return (f"{label}: {int(over.sum())} of {o.numel()} values off, max abs err {float(err.max()):.3g}; "
                f"at {idx} got {float(o[idx]):.6g} want {float(r[idx]):.6g} (atol {atol:g}, rtol {rtol:g})")
    return None


@dataclass(frozen=True)
class Timing:
    median_us: float
    iqr_us: float
    reps: int


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time: at least min_reps calls, at most max_reps, aiming at target_ms of kernel time."""

    min_reps: int = 5
    max_reps: int = 50
    target_ms: float = 1.5
    warmup: int = 2


def quantile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class Timer:
    """CUDA-event timing on torch's current stream, with an L2 flush (a 256 MB memset) before every timed call."""

    def __init__(self, policy: TimingPolicy):
        import torch
        self.torch = torch
        self.policy = policy
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def time(self, fn: Callable[[], Any]) -> Timing:
        torch, p = self.torch, self.policy
        for _ in range(p.warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush_buf.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        estimate_ms = max(start.elapsed_time(end), 1e-3)
        reps = int(min(max(p.target_ms / estimate_ms, p.min_reps), p.max_reps))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        samples = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
        return Timing(quantile(samples, 0.5), quantile(samples, 0.75) - quantile(samples, 0.25), reps)


def copy_bandwidth_gbps(timer: Timer, nbytes: int = 2**30) -> float:
    """Device-to-device copy, bytes read + written over the median time: the ceiling for % of bandwidth."""
    torch = timer.torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = timer.time(lambda: dst.copy_(src))
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9


def _smi(query: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def clocks() -> str:
    return _smi("clocks.sm,clocks.mem,clocks.max.sm")


def fingerprint(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """GPU, SM count, driver, CUDA, NVRTC, torch and package versions, date: attached to every measurement."""
    import torch
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sm_count": str(props.multi_processor_count),
            "gpu_memory_gib": f"{props.total_memory / 2**30:.0f}", "driver": _smi("driver_version"),
            "cuda_runtime": str(torch.version.cuda), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        from cuda.bindings import driver, nvrtc
        info["cuda_driver_api"] = str(driver.cuDriverGetVersion()[1])
        _, major, minor = nvrtc.nvrtcVersion()
        info["nvrtc"] = f"{major}.{minor}"
        import cuda.core
        info["cuda_core"] = cuda.core.__version__
    except Exception as exc:  # the fingerprint must never stop a measurement
        info["cuda_python"] = f"unavailable: {exc!r}"[:200]
    info.update(extra or {})
    return info
