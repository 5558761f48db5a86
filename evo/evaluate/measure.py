"""Device-side checking and timing, shared by the GPU worker and the bench command: compare outputs with the
reference, and time a launch with CUDA events around each call and an L2 flush before it (fingerprint.py describes
the machine the times were taken on). Only torch and the standard library; runs wherever torch runs (the
comparisons are tested on the CPU)."""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

FLUSH_BYTES = 256 * 2**20   # more than the H200's 60 MB L2: a flush before each timed call leaves it cold
# The hold: after the flush, the GPU waits (a spin of torch.cuda._sleep) before a call's start event, long enough to
# cover HOLD_MARGIN times the longest of that call's latest host paths, plus HOLD_PAD_US, less the flush's own time
# (at most HOLD_MAX_US). Then the host has enqueued the call before the GPU reaches it, and an eager call's events hold
# its GPU time alone, as a graph replay's do: a slow host path (torch.compile's guards, a custom op's Python, a
# busy CPU) can no longer add GPU idle time to it. The host path is still measured and reported beside the time.
HOLD_MARGIN = 1.5
HOLD_PAD_US = 20.0
HOLD_MAX_US = 5000.0
HOLD_SEEN = 4   # host paths a hold is sized from: the call's latest
SPIN_CALIBRATION_CYCLES = 2_000_000   # about 1 ms of spin at Hopper's clocks, timed once per timer


CHUNK_ELEMENTS = 2**26   # compared a block of rows at a time: the widest rows' fp32 temporaries stay at 256 MiB


def mismatch(out: Any, ref: Any, atol: float, rtol: float, label: str) -> str | None:
    """None when `out` matches `ref` within |out - ref| <= atol + rtol * |ref| everywhere; else a short summary.
    NaN and Inf never pass, and a shape mismatch is reported as such. Compared in blocks of leading rows, so that
    a 2^31-element output needs no full-size fp32 temporaries (the backward's widest rows on an 80 GB GPU)."""
    import torch
    if tuple(out.shape) != tuple(ref.shape):
        return f"{label}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    rows = out.shape[0] if out.dim() > 1 else 1
    step = max(1, CHUNK_ELEMENTS // max(1, out.numel() // max(rows, 1)))
    nonfinite, first_bad = 0, None
    over_count, max_err, worst = 0, 0.0, None   # worst: (score, flat index, got, want)
    for start in range(0, rows, step):
        o = (out[start:start + step] if out.dim() > 1 else out).float()
        r = (ref[start:start + step] if out.dim() > 1 else ref).float()
        finite = torch.isfinite(o)
        if not bool(finite.all()):
            nonfinite += int((~finite).sum())
            if first_bad is None:
                at = [int(i) for i in torch.nonzero(~finite)[0]]
                first_bad = tuple([at[0] + start, *at[1:]] if out.dim() > 1 else at)
            continue
        if nonfinite:
            continue
        err = (o - r).abs()
        bound = rtol * r.abs()
        over = err > atol + bound
        if bool(over.any()):
            over_count += int(over.sum())
            max_err = max(max_err, float(err.max()))
            k = int(torch.argmax(err - bound))
            score = float((err - bound).flatten()[k])
            if worst is None or score > worst[0]:
                worst = (score, start * (o.numel() // max(o.shape[0], 1)) + k, float(o.flatten()[k]),
                         float(r.flatten()[k]))
    if nonfinite:
        return f"{label}: {nonfinite} non-finite values, first at {first_bad}"
    if worst is not None:
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst[1]), tuple(out.shape)))
        return (f"{label}: {over_count} of {out.numel()} values off, max abs err {max_err:.3g}; "
                f"at {idx} got {worst[2]:.6g} want {worst[3]:.6g} (atol {atol:g}, rtol {rtol:g})")
    return None


def tolerance_of(problem: Any, name: str, dtype: str) -> tuple[float, float]:
    """(atol, rtol) for one output: the problem's output_tolerance(name, dtype) where it declares one (an fp32
    statistic such as rstd, held to its own scale), else its dtype's tolerance. docs/tolerances.md says why."""
    per_output = getattr(problem, "output_tolerance", None)
    return (per_output(name, dtype) if per_output is not None else None) or problem.tolerance(dtype)


@dataclass(frozen=True)
class Timing:
    median_us: float
    iqr_us: float
    reps: int
    last: int = 0          # which of the rotated callables ran last (its outputs are the ones left in memory)
    graph: bool = False    # timed as CUDA-graph replays (no host launch overhead inside the events)
    uncaptured: bool = False   # short enough for a graph, but capture failed: timed eagerly
    host_us: float = 0.0   # median host time of one call (enqueueing it): above the flush's and the hold's GPU time,
                           # it can leak
    hold_us: float = 0.0   # median GPU wait after the flush before the start event (see HOLD_MARGIN)


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time: at least min_reps calls, at most max_reps, aiming at target_ms of kernel time.
    Calls shorter than graph_below_us are captured in a CUDA graph and timed as replays, so that host launch
    overhead cannot leak into the events (0 disables graphs)."""

    min_reps: int = 5
    max_reps: int = 50
    target_ms: float = 1.5
    warmup: int = 2
    graph_below_us: float = 0.0


def quantile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_us: list[float], last: int = 0, graph: bool = False, uncaptured: bool = False,
              host_us: Sequence[float] = (), hold_us: Sequence[float] = ()) -> Timing:
    s = sorted(samples_us)
    host = quantile(sorted(host_us), 0.5) if host_us else 0.0
    hold = quantile(sorted(hold_us), 0.5) if hold_us else 0.0
    return Timing(quantile(s, 0.5), quantile(s, 0.75) - quantile(s, 0.25), len(s), last, graph, uncaptured, host,
                  hold)


class Holds:
    """The hold before each sample of one callable: sized from the longest of its last HOLD_SEEN host paths (warm-up
    calls and earlier samples), so that a path that grows (a busy host) gets a longer hold from its next sample on,
    and one slow first call (a compile, a first-call tuning) does not hold every sample after it."""

    def __init__(self, timer: "Timer"):
        self.timer, self.recent = timer, collections.deque(maxlen=HOLD_SEEN)

    def seen(self, host_us: float) -> None:
        self.recent.append(host_us)

    def next(self) -> float:
        longest = max(self.recent, default=0.0)
        if longest <= 0 or not hasattr(self.timer.torch.cuda, "_sleep"):   # a torch without the spin: no hold
            return 0.0
        return min(HOLD_MAX_US, max(0.0, HOLD_MARGIN * longest + HOLD_PAD_US - self.timer.flush_us()))


class Timer:
    """CUDA-event timing on torch's current stream, with an L2 flush (a 256 MB memset) before every timed call.

    time() takes one callable or several that it rotates through (sample i runs fns[i % k]): several input sets
    larger than one make a kernel that caches results or skips repeated work visible to the checks that follow."""

    def __init__(self, policy: TimingPolicy):
        import torch
        self.torch = torch
        self.policy = policy
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self._flush_us: float | None = None
        self._cycles_per_us: float | None = None
        self._clock = time.perf_counter
        self.estimate_holds = Holds(self)

    def _hosted(self, fn: Callable[[], Any]) -> float:
        """One untimed call (a warm-up); its host microseconds."""
        began = self._clock()
        fn()
        return (self._clock() - began) * 1e6

    def _sample(self, fn: Callable[[], Any], hold_us: float = 0.0) -> tuple[Any, Any, float]:
        """(start event, end event, host microseconds of the call). The flush, then the hold (hold_us of GPU spin),
        run on the GPU while the host enqueues the call; a call whose host time exceeds both (and the GPU's backlog)
        leaves the GPU idle between the events, and that idle time is counted. Holds sizes the hold so that it does
        not: an eager call's events then hold its GPU time."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush_buf.zero_()
        if hold_us > 0:
            torch.cuda._sleep(max(1, int(hold_us * self.cycles_per_us())))
        start.record()
        began = self._clock()
        fn()
        host = (self._clock() - began) * 1e6
        end.record()
        return start, end, host

    def cycles_per_us(self) -> float:
        """The GPU spin's clock cycles per microsecond, timed once (torch.cuda._sleep counts SM clock cycles)."""
        if self._cycles_per_us is None:
            torch = self.torch
            torch.cuda._sleep(SPIN_CALIBRATION_CYCLES // 10)   # the spin kernel loaded, the clocks up
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(SPIN_CALIBRATION_CYCLES)
            b.record()
            b.synchronize()
            self._cycles_per_us = SPIN_CALIBRATION_CYCLES / max(a.elapsed_time(b) * 1e3, 1e-3)
        return self._cycles_per_us

    def flush_us(self) -> float:
        """The L2 flush's own GPU time (median of a few), measured once: the host time a call may take unseen."""
        if self._flush_us is None:
            events = []
            for _ in range(5):
                a, b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
                a.record()
                self.flush_buf.zero_()
                b.record()
                events.append((a, b))
            self.torch.cuda.synchronize()
            self._flush_us = quantile(sorted(a.elapsed_time(b) * 1e3 for a, b in events), 0.5)
        return self._flush_us

    def estimate_us(self, fn: Callable[[], Any]) -> float:
        """One call's GPU time after the warm-up calls, held as a timed sample is (0 warm-ups: no hold). The host
        paths it saw stay in self.estimate_holds, where time() starts sizing its holds from."""
        holds = self.estimate_holds = Holds(self)
        for _ in range(self.policy.warmup):
            holds.seen(self._hosted(fn))
        start, end, host = self._sample(fn, holds.next())
        holds.seen(host)
        end.synchronize()
        return max(start.elapsed_time(end), 1e-3) * 1e3

    def reps_for(self, estimate_us: float) -> int:
        p = self.policy
        return int(min(max(p.target_ms * 1e3 / estimate_us, p.min_reps), p.max_reps))

    def graphed(self, fns: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]] | None:
        """Each callable captured once into a CUDA graph on the current stream; None if capture fails."""
        torch = self.torch
        graphs = []
        try:
            for fn in fns:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
                    fn()
                graphs.append(g)
        except Exception:  # a callable that cannot be captured (host sync, allocation policy): time it eagerly
            torch.cuda.synchronize()
            return None
        return [g.replay for g in graphs]

    def is_short(self, fn: Callable[[], Any], tries: int = 3) -> bool:
        """Whether a call's GPU time is shorter than graph_below_us: the least of a few estimates, so that one slow
        host call (a garbage collection, a guard check) cannot flip the decision; and where every estimate is long,
        the least of a few of its graph replay's, so that a slow host path is not taken for a long kernel. A call
        whose host path outlasts its kernel (torch.compile's guards and wrappers: 50 us before an 8 us kernel on
        an H200, 2026-12-04) was timed eagerly with its host gap inside the events, and every candidate on its
        case with it: a baseline's time inflated by the host's load, a flattering fitness."""
        if self.policy.graph_below_us <= 0:
            return False
        if min(self.estimate_us(fn) for _ in range(tries)) < self.policy.graph_below_us:
            return True
        replays = self.graphed([fn])
        return replays is not None and min(self.estimate_us(replays[0]) for _ in range(tries)) < \
            self.policy.graph_below_us

    def time(self, fns: Callable[[], Any] | Sequence[Callable[[], Any]], graphs: bool | None = None) -> Timing:
        """Median of event-timed samples. graphs=True captures the calls in CUDA graphs first (eager, flagged
        uncaptured, if capture fails), False times them eagerly, None decides by one estimate against
        graph_below_us. The GPU worker decides once per case and passes the decision, so that a case's baseline and
        every candidate on it are timed the same way, measurement after measurement."""
        fns = [fns] if callable(fns) else list(fns)
        estimate = self.estimate_us(fns[0])
        graph = uncaptured = False
        if graphs is None:
            graphs = estimate < self.policy.graph_below_us
        if graphs:
            replays = self.graphed(fns)
            uncaptured = replays is None
            if replays is not None:
                fns, graph = replays, True
                estimate = self.estimate_us(fns[0])
        reps = self.reps_for(estimate)
        holds, samples, held = self.estimate_holds, [], []   # sized first from the estimate's calls of fns[0]
        for i in range(reps):
            held.append(holds.next())
            samples.append(self._sample(fns[i % len(fns)], held[-1]))
            holds.seen(samples[-1][2])
        self.torch.cuda.synchronize()
        return summarize([s.elapsed_time(e) * 1e3 for s, e, _ in samples], (reps - 1) % len(fns), graph, uncaptured,
                         [h for _, _, h in samples], held)

    def graphed_together(self, fns: Sequence[Callable[[], Any]]) -> tuple[list[Callable[[], Any]], bool]:
        """Callables to time side by side, each captured in a CUDA graph when any is shorter than graph_below_us
        (the rule of time(), applied to all alike); all stay eager if one cannot be captured. (callables, graphed)"""
        fns = list(fns)
        if not any(self.estimate_us(fn) < self.policy.graph_below_us for fn in fns):
            return fns, False
        replays = self.graphed(fns)
        return (fns, False) if replays is None else (replays, True)

    def time_interleaved(self, fns: Sequence[Callable[[], Any]], reps: int) -> list[Timing]:
        """Several callables interleaved sample by sample (A B C A B C ...), each after its own flush: drift in
        clocks or temperature falls on all alike. Used for finalists and the bench."""
        holds = [Holds(self) for _ in fns]
        for _ in range(max(1, self.policy.warmup)):
            for fn, hold in zip(fns, holds):
                hold.seen(self._hosted(fn))
        samples: list[list[tuple[Any, Any, float]]] = [[] for _ in fns]
        held: list[list[float]] = [[] for _ in fns]
        for _ in range(reps):
            for i, fn in enumerate(fns):
                held[i].append(holds[i].next())
                samples[i].append(self._sample(fn, held[i][-1]))
                holds[i].seen(samples[i][-1][2])
        self.torch.cuda.synchronize()
        return [summarize([s.elapsed_time(e) * 1e3 for s, e, _ in p], host_us=[h for _, _, h in p], hold_us=w)
                for p, w in zip(samples, held)]


def copy_bandwidth_gbps(timer: Timer, nbytes: int = 2**30) -> float:
    """Device-to-device copy, bytes read + written over the median time: the ceiling for % of bandwidth."""
    torch = timer.torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t = timer.time(lambda: dst.copy_(src))
    return 2 * nbytes / (t.median_us * 1e-6) / 1e9
