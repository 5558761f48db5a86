"""The output comparison used by the GPU worker (runs on CPU torch here): NaN never passes, misses are located."""
import pytest
import torch

from kernel_factory.evo.evaluate.measure import mismatch, quantile


def test_match_and_miss():
    ref = torch.randn(64, 33)
    assert mismatch(ref.clone(), ref, 1e-5, 1e-4, "y") is None
    off = ref.clone()
    off[7, 5] += 1.0
    msg = mismatch(off, ref, 1e-5, 1e-4, "y")
    assert msg and "1 of 2112 values off" in msg and "(7, 5)" in msg


def test_nan_and_inf_never_pass():
    ref = torch.randn(8, 8)
    for bad in (float("nan"), float("inf")):
        out = ref.clone()
        out[3, 3] = bad
        assert "non-finite" in mismatch(out, ref, 1.0, 1.0, "y")
    assert "non-finite" in mismatch(torch.full((4, 4), float("nan")), ref[:4, :4], 1e9, 1e9, "y")


def test_low_precision_output_within_rounding_passes():
    ref = torch.randn(128, 256) * 3
    assert mismatch(ref.to(torch.bfloat16), ref, 1e-3, 8e-3, "y") is None
    assert mismatch(ref.to(torch.bfloat16) * 1.02, ref, 1e-3, 8e-3, "y") is not None


def test_shape_mismatch():
    assert "shape" in mismatch(torch.zeros(2, 3), torch.zeros(3, 2), 1, 1, "y")


def test_quantile():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.75) == 5.0


CYCLES_PER_US = 1000.0   # the simulated GPU's spin clock


class Clock:
    """A simulated GPU for the timer, with a host timeline and a GPU timeline: the host enqueues work in order and
    the GPU runs it in order, never before it is enqueued. An eager call costs its host path (popped from host_us;
    1 µs once they run out), then its kernel runs on the GPU; a graph replay costs 1 µs of host and the kernel. An
    event records when the GPU reaches it, so a host path longer than the GPU work queued ahead of the call leaves
    the GPU idle inside the events, as on a real GPU."""

    def __init__(self, kernel_us: float, host_us: list[float], capturable: bool = True, flush_us: float = 1.0):
        self.host_t = self.gpu_t = 0.0
        self.kernel_us, self.host_us, self.capturing = kernel_us, list(host_us), False
        self.capturable, self.flush_us = capturable, flush_us
        clock = self

        class Event:
            def __init__(self, enable_timing=True):
                self.at = 0.0

            def record(self):
                self.at = clock.gpu(0.0)

            def synchronize(self):
                clock.host_t = max(clock.host_t, self.at)

            def elapsed_time(self, other):
                return (other.at - self.at) / 1e3

        class Graph:
            def replay(self):
                clock.host_t += 1.0
                clock.gpu(clock.kernel_us)

        class Capture:
            def __init__(self, graph, stream=None):
                pass

            def __enter__(self):
                if not clock.capturable:
                    raise RuntimeError("operation not permitted when stream is capturing")
                clock.capturing = True

            def __exit__(self, *exc):
                clock.capturing = False

        def synchronize():
            clock.host_t = max(clock.host_t, clock.gpu_t)

        cuda = type("cuda", (), {"Event": Event, "CUDAGraph": Graph, "graph": Capture,
                                 "current_stream": staticmethod(lambda: None), "synchronize": staticmethod(synchronize),
                                 "_sleep": staticmethod(lambda cycles: clock.gpu(cycles / CYCLES_PER_US))})
        self.torch = type("torch", (), {"cuda": cuda})

    def gpu(self, us: float) -> float:
        """Work of `us` enqueued now: it starts once the GPU is free and the host has enqueued it; when it ends."""
        self.gpu_t = max(self.gpu_t, self.host_t) + us
        return self.gpu_t

    def seconds(self) -> float:   # the host's perf_counter
        return self.host_t / 1e6

    def call(self):
        if not self.capturing:
            self.host_t += self.host_us.pop(0) if self.host_us else 1.0
            self.gpu(self.kernel_us)


def timer_on(clock: Clock, graph_below_us: float, warmup: int = 0):
    from kernel_factory.evo.evaluate.measure import Timer, TimingPolicy
    timer = Timer.__new__(Timer)
    timer.torch, timer.policy = clock.torch, TimingPolicy(warmup=warmup, graph_below_us=graph_below_us)
    timer._flush_us, timer._cycles_per_us, timer._clock = clock.flush_us, None, clock.seconds
    timer.flush_buf = type("buf", (), {"zero_": lambda self: clock.gpu(clock.flush_us)})()
    return timer


def test_one_slow_host_call_does_not_decide_how_a_call_is_timed():
    """A 5 us kernel whose first estimate met a 90 us host stall: the least of a few estimates says short."""
    clock = Clock(5.0, host_us=[90.0, 2.0, 3.0])
    assert timer_on(clock, 30.0).is_short(clock.call)
    assert not timer_on(clock, 0.0).is_short(clock.call), "graph_below_us = 0 disables graphs"


def test_a_slow_host_path_before_a_short_kernel_is_short():
    """A host path slow every time (torch.compile's guards) before a 5 us kernel: its graph replay decides, so the
    call is timed as replays like every candidate on its case; a call that cannot be captured stays eager, and a
    long kernel is long however it is launched."""
    stalled = Clock(5.0, host_us=[90.0, 80.0, 70.0])
    assert timer_on(stalled, 30.0).is_short(stalled.call)
    uncapturable = Clock(5.0, host_us=[90.0, 80.0, 70.0], capturable=False)
    assert not timer_on(uncapturable, 30.0).is_short(uncapturable.call)
    long_kernel = Clock(200.0, host_us=[1.0] * 10)
    assert not timer_on(long_kernel, 30.0).is_short(long_kernel.call)


def test_a_decided_way_of_timing_holds_whatever_the_estimate():
    """graphs=True replays the graph even when this call's estimate is long (host stall); False stays eager even
    when it is short; None decides by the estimate."""
    clock = Clock(5.0, host_us=[200.0])
    graphed = timer_on(clock, 30.0).time(clock.call, graphs=True)
    assert graphed.graph and not graphed.uncaptured and graphed.median_us == pytest.approx(5.0)
    clock = Clock(5.0, host_us=[1.0] * 100)
    eager = timer_on(clock, 30.0).time(clock.call, graphs=False)
    assert not eager.graph and eager.median_us == pytest.approx(5.0)
    clock = Clock(5.0, host_us=[200.0] + [20.0] * 100)
    by_estimate = timer_on(clock, 30.0).time(clock.call)
    assert not by_estimate.graph, "None: one estimate (its 200 µs host path inside) decides"
    assert by_estimate.median_us == pytest.approx(5.0) and by_estimate.host_us == pytest.approx(20.0)


def test_an_eager_call_with_a_slow_host_path_is_timed_at_its_gpu_time(monkeypatch):
    """A 50 µs kernel behind a 200 µs host path, after an 85 µs flush: without the hold the GPU idles inside the
    events for the host path less the flush and the previous sample's kernel still running (200 - 85 - 50 = 65 µs:
    what a custom op's Python or torch.compile's guards did to eager-timed rows on a slow host); with it, the events
    hold the kernel alone, and the host path is reported beside."""
    from kernel_factory.evo.evaluate import measure
    clock = Clock(50.0, host_us=[200.0] * 100, flush_us=85.0)
    held = timer_on(clock, 30.0, warmup=2).time(clock.call, graphs=False)
    assert held.median_us == pytest.approx(50.0) and held.host_us == pytest.approx(200.0)
    assert held.hold_us == pytest.approx(1.5 * 200 + 20 - 85)
    monkeypatch.setattr(measure.Holds, "next", lambda self: 0.0)   # the timer as it was before the hold
    clock = Clock(50.0, host_us=[200.0] * 100, flush_us=85.0)
    leaked = timer_on(clock, 30.0, warmup=2).time(clock.call, graphs=False)
    assert leaked.median_us == pytest.approx(200.0 - 85.0 - 50.0 + 50.0) and leaked.hold_us == 0.0


def test_interleaved_calls_each_get_the_hold_their_host_path_needs():
    """A bench row: our launch (2 µs of host) beside a peer with a 300 µs host path, both 40 µs kernels, interleaved
    sample by sample: both timed at 40 µs; only the peer is held, and neither is marked as having its host inside."""
    from kernel_factory.evo.tools.peers import host_inside
    ours = Clock(40.0, [], flush_us=85.0)
    peer_host = [300.0] * 100

    def peer_call():
        ours.host_t += peer_host.pop(0)
        ours.gpu(40.0)

    timer = timer_on(ours, 30.0, warmup=1)
    mine, theirs = timer.time_interleaved([ours.call, peer_call], reps=10)
    assert mine.median_us == pytest.approx(40.0) and theirs.median_us == pytest.approx(40.0)
    assert mine.hold_us == 0.0 and theirs.hold_us == pytest.approx(1.5 * 300 + 20 - 85)
    for t in (mine, theirs):
        assert not host_inside({"us": t.median_us, "graph": False, "host_us": t.host_us, "hold_us": t.hold_us}, 85.0)


def test_a_host_path_that_grows_is_held_from_its_next_sample_and_one_past_the_cap_shows():
    """A host that turns busy mid-run: the first slow sample leaks, the next ones are held (the median is the
    kernel's). A host path past the hold's cap still leaks, and the reports mark it (host inside)."""
    from kernel_factory.evo.evaluate.measure import HOLD_MAX_US
    from kernel_factory.evo.tools.peers import host_inside
    clock = Clock(60.0, host_us=[5.0] * 3 + [400.0] * 60, flush_us=85.0)
    t = timer_on(clock, 30.0, warmup=1).time(clock.call, graphs=False)
    assert t.median_us == pytest.approx(60.0) and t.host_us == pytest.approx(400.0)
    slow = HOLD_MAX_US * 2
    clock = Clock(60.0, host_us=[slow] * 60, flush_us=85.0)
    capped = timer_on(clock, 30.0, warmup=1).time(clock.call, graphs=False)
    assert capped.hold_us == pytest.approx(HOLD_MAX_US)
    # the flush, the hold and the previous sample's kernel run while the host enqueues; the rest of its path is idle
    assert capped.median_us == pytest.approx(slow - 85.0 - HOLD_MAX_US - 60.0 + 60.0)
    assert host_inside({"us": capped.median_us, "graph": False, "host_us": capped.host_us,
                        "hold_us": capped.hold_us}, 85.0)


def test_mismatch_in_blocks_reports_as_one_pass(monkeypatch):
    """Compared a block of rows at a time (the widest outputs): counts, the worst element and the first non-finite
    one are those of the whole tensor, wherever the blocks split it."""
    from kernel_factory.evo.evaluate import measure
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    ref = torch.randn(37, 53, generator=gen)
    off = ref.clone()
    rows = torch.randint(0, 37, (5,), generator=gen)
    off[rows, 7] += 0.5
    off[int(rows[2]), 11] += 3.0
    whole = measure.mismatch(off, ref, 1e-5, 1e-4, "y")
    nan = off.clone()
    nan[30, 3] = float("nan")
    nan[31, 0] = float("inf")
    whole_nan = measure.mismatch(nan, ref, 1e-5, 1e-4, "y")
    monkeypatch.setattr(measure, "CHUNK_ELEMENTS", 53 * 4)   # blocks of 4 rows
    assert measure.mismatch(off, ref, 1e-5, 1e-4, "y") == whole
    assert f"at ({int(rows[2])}, 11)" in whole and "max abs err 3" in whole
    assert measure.mismatch(nan, ref, 1e-5, 1e-4, "y") == whole_nan == "y: 2 non-finite values, first at (30, 3)"
    assert measure.mismatch(ref.clone(), ref, 1e-5, 1e-4, "y") is None


def test_the_backward_reference_in_row_blocks_is_the_whole_tensor_formula(monkeypatch):
    from kernel_factory.problems import rmsnorm_bwd
    from kernel_factory.evo.types import Case
    p = rmsnorm_bwd.RmsNormBackward()
    inputs = p.make_inputs(Case((29, 40), "bfloat16"), int(torch.randint(0, 2**31, (1,))), "cpu")
    whole = p.reference(inputs)
    monkeypatch.setattr(rmsnorm_bwd, "REFERENCE_CHUNK", 40 * 3)   # blocks of 3 rows
    blocks = p.reference(inputs)
    xhat = inputs["x"].float() * inputs["rstd"][:, None]
    g = inputs["dy"].float() * inputs["w"]
    dx = (g - xhat * (g * xhat).mean(dim=-1, keepdim=True)) * inputs["rstd"][:, None]
    assert torch.equal(blocks["dx"], whole["dx"]) and torch.allclose(blocks["dx"], dx, rtol=1e-6, atol=1e-6)
    assert torch.allclose(blocks["dw"], (inputs["dy"].float() * xhat).sum(dim=0), rtol=1e-5, atol=1e-5)


def test_one_slow_first_call_does_not_hold_every_sample_after_it():
    """A first call that compiles or tunes (50 ms of host) before 2 µs calls: the hold is sized from the call's
    latest host paths, so after a few samples the 80 µs kernel runs unheld (the flush covers its host path)."""
    from kernel_factory.evo.evaluate.measure import HOLD_MAX_US, HOLD_SEEN
    clock = Clock(80.0, host_us=[50_000.0] + [2.0] * 100, flush_us=85.0)
    t = timer_on(clock, 30.0, warmup=2).time_interleaved([clock.call], reps=20)[0]
    assert t.median_us == pytest.approx(80.0) and t.hold_us == 0.0
    clock = Clock(80.0, host_us=[50_000.0] + [2.0] * 100, flush_us=85.0)
    first = timer_on(clock, 30.0, warmup=1).time_interleaved([clock.call], reps=HOLD_SEEN - 1)[0]
    assert first.hold_us == pytest.approx(HOLD_MAX_US), "within the call's latest paths the slow one still counts"
