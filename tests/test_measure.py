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


class Clock:
    """A simulated GPU for the timer: an eager call costs its host overhead (the GPU idles between the events
    while the host enqueues) plus its kernel; a graph replay costs the kernel alone."""

    def __init__(self, kernel_us: float, host_us: list[float], capturable: bool = True):
        self.now, self.kernel_us, self.host_us, self.capturing = 0.0, kernel_us, list(host_us), False
        self.capturable = capturable
        clock = self

        class Event:
            def __init__(self, enable_timing=True):
                self.at = 0.0

            def record(self):
                self.at = clock.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return (other.at - self.at) / 1e3

        class Graph:
            def replay(self):
                clock.now += clock.kernel_us

        class Capture:
            def __init__(self, graph, stream=None):
                pass

            def __enter__(self):
                if not clock.capturable:
                    raise RuntimeError("operation not permitted when stream is capturing")
                clock.capturing = True

            def __exit__(self, *exc):
                clock.capturing = False

        cuda = type("cuda", (), {"Event": Event, "CUDAGraph": Graph, "graph": Capture,
                                 "current_stream": staticmethod(lambda: None), "synchronize": staticmethod(lambda: None)})
        self.torch = type("torch", (), {"cuda": cuda})

    def call(self):
        if not self.capturing:
            self.now += (self.host_us.pop(0) if self.host_us else 1.0) + self.kernel_us


def timer_on(clock: Clock, graph_below_us: float):
    from kernel_factory.evo.evaluate.measure import Timer, TimingPolicy
    timer = Timer.__new__(Timer)
    timer.torch, timer.policy, timer._flush_us = clock.torch, TimingPolicy(warmup=0, graph_below_us=graph_below_us), 1.0
    timer.flush_buf = type("buf", (), {"zero_": lambda self: None})()
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
    assert not eager.graph and eager.median_us == pytest.approx(6.0)
    clock = Clock(5.0, host_us=[200.0] + [20.0] * 100)
    by_estimate = timer_on(clock, 30.0).time(clock.call)
    assert not by_estimate.graph and by_estimate.median_us == pytest.approx(25.0), "None: one estimate decides"


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
