"""Paired timing's guard against a one-off glitch in the baseline.

With evaluator.gpu.paired, every candidate's case is timed interleaved with the baseline, and its fitness divides by
that baseline time: slow drift cancels. A single stall does not: on an H100 (2026-12-05, quickstart against
torch.compile) one candidate's paired baseline for 32768x8192 came out at 1912 us where the run's other 95 measured
356 to 359, that candidate became the run's best at 0.885x, and its A/B re-time gave 0.778x.

So a paired baseline time is compared with the case's usual one: the median of its last HISTORY accepted paired
times, or the worker's own baseline measurement until HISTORY_MIN exist. Off by more than BAND either way, the pair
is timed again, at most TRIES times in all; the try whose baseline is closest to the usual one is kept. A shift that
every try confirms is accepted (the clocks moved: the usual time follows it), and every retry is kept as evidence.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, TypeVar

BAND = 0.10        # a paired baseline more than 10% from its usual time is timed again
HISTORY = 9        # the usual time: the median of this many accepted paired times of the case
HISTORY_MIN = 3    # below this many, the worker's own (unpaired) baseline measurement is the usual time
TRIES = 3          # pairs timed at most, the first included

T = TypeVar("T")


class PairedBaselines:
    """Per case: the accepted paired baseline times, and the evidence of every pair that was timed again."""

    def __init__(self, band: float = BAND, history: int = HISTORY, tries: int = TRIES):
        self.band, self.history, self.tries = band, history, tries
        self.accepted: dict[str, list[float]] = {}
        self.retried: dict[str, list[float]] = {}   # this candidate's: case -> every try's baseline time

    def usual(self, key: str, fallback: float | None) -> float | None:
        seen = self.accepted.get(key, [])
        return statistics.median(seen) if len(seen) >= HISTORY_MIN else fallback

    def off(self, us: float, usual: float | None) -> bool:
        return usual is not None and usual > 0 and abs(math.log(us / usual)) > math.log1p(self.band)

    def vetted(self, key: str, time_pair: Callable[[], tuple[T, Any]], fallback: float | None) -> tuple[T, Any]:
        """time_pair() -> (candidate timing, baseline timing), each with .median_us. Returns the pair kept."""
        usual = self.usual(key, fallback)
        tries = [time_pair()]
        while self.off(tries[-1][1].median_us, usual) and len(tries) < self.tries:
            tries.append(time_pair())
        if len(tries) > 1:
            self.retried[key] = [t[1].median_us for t in tries]
        kept = min(tries, key=lambda t: abs(math.log(t[1].median_us / usual))) if usual else tries[0]
        seen = self.accepted.setdefault(key, [])
        seen.append(kept[1].median_us)
        del seen[:-self.history]
        return kept

    def take_evidence(self) -> dict[str, list[float]]:
        """The retries since the last call (one candidate's), for its reply."""
        out, self.retried = self.retried, {}
        return out
