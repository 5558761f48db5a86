"""GPU tests of the timer's hold (evo/evaluate/measure.py; run on an H200: pytest -m gpu --gpu
tests/gpu/test_measure_gpu.py): an eager call whose host path outlasts the L2 flush (torch.compile's guards, a custom
op's Python, a busy CPU) must time as its kernel does, not as its host path. The same kernel is timed launched at
once and behind 300 us of host work; with the hold the two agree, and without it (the hold capped at 0) the host
path shows in the second, so that this test can tell a timer that leaks from one that does not."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

HOST_US = 300.0   # host work before the launch: well past the 256 MB flush's GPU time on an H100 or H200


@pytest.fixture(scope="module")
def torch():
    import torch as t
    if not t.cuda.is_available():
        pytest.skip("no CUDA device")
    return t


def calls(torch):
    """(fast, slow): the same in-place kernel on a fresh random 8 MB tensor, launched at once or after HOST_US of
    host work (a busy wait, as a Python-heavy launch path is)."""
    x = torch.randn(2**21, device="cuda")

    def fast():
        x.mul_(1.0000001)

    def slow():
        until = time.perf_counter() + HOST_US * 1e-6
        while time.perf_counter() < until:
            pass
        x.mul_(1.0000001)
    return fast, slow


def medians(torch, monkeypatch, hold_max_us: float | None) -> tuple[float, float, float]:
    """(fast median, slow median, slow's median hold), both timed eagerly by a fresh timer."""
    from kernel_factory.evo.evaluate import measure
    if hold_max_us is not None:
        monkeypatch.setattr(measure, "HOLD_MAX_US", hold_max_us)
    timer = measure.Timer(measure.TimingPolicy(min_reps=20, max_reps=40))
    fast, slow = calls(torch)
    a = timer.time(fast, graphs=False)
    b = timer.time(slow, graphs=False)
    print(f"hold cap {hold_max_us}: fast {a.median_us:.1f} us, slow {b.median_us:.1f} us "
          f"(host {b.host_us:.0f} us, hold {b.hold_us:.0f} us, flush {timer.flush_us():.0f} us)")
    return a.median_us, b.median_us, b.hold_us


def test_a_slow_host_path_stays_out_of_an_eager_calls_time(torch, monkeypatch):
    fast, slow, hold = medians(torch, monkeypatch, None)
    assert hold > 0, "a host path past the flush is held"
    assert slow < 1.5 * fast + 5.0, f"held: the host path leaked into the events ({slow:.1f} us vs {fast:.1f} us)"


def test_without_the_hold_the_host_path_shows(torch, monkeypatch):
    """The control: the test above could not pass by accident on this GPU (the flush alone does not cover it)."""
    fast, slow, hold = medians(torch, monkeypatch, 0.0)
    assert hold == 0
    assert slow > fast + 0.3 * HOST_US, f"unheld: expected the host path inside ({slow:.1f} us vs {fast:.1f} us)"
