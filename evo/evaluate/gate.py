"""The correctness gate, run in the GPU worker before anything is timed. For every check case it launches the
candidate four times, each against a fresh reference:

1. fresh random inputs (seed A) into fresh outputs, poisoned with NaN and fenced by canary guard regions;
2. new random inputs (seed B) copied into the *same* buffers, outputs left as they are: a kernel that caches or
   skips work when called again with the same pointers returns the stale result and fails;
3. the same inputs again, outputs poisoned: the result must be bitwise identical to launch 2 (a racy reduction
   varies between runs);
4. adversarial rows (zero, huge, tiny, denormal, the dtype's extremes) planted into the inputs, where the problem
   provides special_inputs().

After every launch: no output value may be NaN/Inf or off the reference, no canary byte may change, and no
input may change. Outputs are verified in full here; timed outputs are sampled by the worker.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from . import measure
from ..protocols import DeclaresDeterminism, Problem, SpecialInputs
from ..types import Case

GUARD_BYTES = 4096   # canary bytes before and after every output buffer (a multiple of every vector width)


class Guarded:
    """Tensors carved out of larger buffers whose ends hold random canary bytes: the outputs (fresh, to be
    written), or the inputs (copy=True: the views hold the inputs' values), so that a write just past either
    end of any tensor a kernel touches is seen. Non-tensor entries pass through unguarded. Only the guard regions
    are filled and kept for comparison: a copy of a whole buffer doubled the memory of every benchmark pool, and an
    fp32 panel of wide rows ran out of GPU memory on it."""

    def __init__(self, outputs: Mapping[str, Any], gen: Any, copy: bool = False):
        import torch
        self.what = "input" if copy else "output"
        self.views: dict[str, Any] = {}
        self._buffers: list[tuple[str, Any, Any]] = []   # (name, buffer, the canaries of both ends)
        for name, t in outputs.items():
            if not hasattr(t, "element_size"):
                self.views[name] = t
                continue
            pad = GUARD_BYTES // t.element_size()
            buf = torch.empty(t.numel() + 2 * pad, dtype=t.dtype, device=t.device)
            raw = buf.view(torch.uint8)
            canaries = torch.randint(0, 256, (2 * GUARD_BYTES,), dtype=torch.uint8, generator=gen, device=t.device)
            raw[:GUARD_BYTES].copy_(canaries[:GUARD_BYTES])
            raw[raw.numel() - GUARD_BYTES:].copy_(canaries[GUARD_BYTES:])
            self.views[name] = buf[pad:pad + t.numel()].view(t.shape)
            if copy:
                self.views[name].copy_(t)
            self._buffers.append((name, buf, canaries))

    def violations(self) -> str | None:
        """Which guard region a kernel wrote into, and how far from the buffer; None if all are intact."""
        import torch
        for name, buf, canaries in self._buffers:
            raw = buf.view(torch.uint8)
            tail = raw.numel() - GUARD_BYTES
            for label, region, saved in (("before", raw[:GUARD_BYTES], canaries[:GUARD_BYTES]),
                                         ("after", raw[tail:], canaries[GUARD_BYTES:])):
                changed = torch.nonzero(region != saved)
                if changed.numel():
                    where = int(changed[-1 if label == "before" else 0])
                    distance = GUARD_BYTES - where if label == "before" else where
                    return (f"wrote outside {self.what} {name!r}: {changed.numel()} canary bytes changed {label} it, "
                            f"nearest at byte {distance if label == 'after' else -distance} past its "
                            f"{'end' if label == 'after' else 'start'}")
        return None


def poison(outputs: Mapping[str, Any]) -> None:
    for t in outputs.values():
        t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)


def snapshot(inputs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.clone() for k, v in inputs.items() if hasattr(v, "clone")}


def changed_inputs(inputs: Mapping[str, Any], saved: Mapping[str, Any]) -> str | None:
    import torch
    for k, before in saved.items():
        if not torch.equal(inputs[k].view(torch.uint8), before.view(torch.uint8)):
            return f"input {k!r} was modified by the kernel"
    return None


def bitwise_equal(a: Mapping[str, Any], b: Mapping[str, Any], names: Any) -> str | None:
    import torch
    for k in names:
        x, y = a[k].view(torch.uint8), b[k].view(torch.uint8)
        if not torch.equal(x, y):
            return f"output {k!r} differs between two launches on identical inputs (a race or stale state)"
    return None


@dataclass
class Gate:
    """Runs the four launches on one case. `launch(inputs, outputs)` runs the candidate and synchronizes."""

    problem: Problem
    launch: Callable[[Mapping[str, Any], Mapping[str, Any]], None]
    device: str = "cuda"
    seeds: int = 2              # fresh random inputs per case: the first into new buffers, the rest into the same
    checked: set = field(default_factory=set)   # the outputs the reference covers (scratch buffers are not)

    def compare(self, case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any], label: str) -> str | None:
        ref = self.problem.reference(inputs)
        self.checked = set(ref)
        for name, want in ref.items():
            atol, rtol = measure.tolerance_of(self.problem, name, case.dtype)
            bad = measure.mismatch(outputs[name], want, atol, rtol, f"{case.key} {label} {name}")
            if bad:
                return bad
        return None

    def run_once(self, case: Case, inputs: Guarded, guarded: Guarded, label: str, *,
                 poisoned: bool = True) -> str | None:
        if poisoned:
            poison(guarded.views)
        saved = snapshot(inputs.views)
        self.launch(inputs.views, guarded.views)
        return (guarded.violations() or inputs.violations() or changed_inputs(inputs.views, saved)
                or self.compare(case, inputs.views, guarded.views, label))

    def check(self, case: Case, rng: random.Random) -> str | None:
        import torch
        p = self.problem
        seed_a, *later = (rng.randrange(2**31) for _ in range(max(2, self.seeds)))
        seed_c = rng.randrange(2**31)
        gen = torch.Generator(device=self.device).manual_seed(seed_a)
        inputs = Guarded(p.make_inputs(case, seed_a, self.device), gen, copy=True)
        guarded = Guarded(p.make_outputs(case, self.device), gen)
        bad = self.run_once(case, inputs, guarded, f"seed {seed_a}")
        if bad:
            return bad
        for seed_b in later:
            refill(inputs.views, p.make_inputs(case, seed_b, self.device))
            bad = self.run_once(case, inputs, guarded, f"seed {seed_b}, second call on the same buffers",
                                poisoned=False)
            if bad:
                return bad
        if not isinstance(p, DeclaresDeterminism) or p.deterministic:
            first = {k: v.clone() for k, v in guarded.views.items()}
            bad = self.run_once(case, inputs, guarded, f"seed {seed_b}, repeated")
            bad = bad or bitwise_equal(guarded.views, first, [k for k in first if k in self.checked])
            if bad:
                return f"{case.key}: {bad}" if not bad.startswith(case.key) else bad
        if isinstance(p, SpecialInputs):
            refill(inputs.views, p.special_inputs(case, seed_c, self.device))
            return self.run_once(case, inputs, guarded, f"special rows (seed {seed_c})")
        return None


def sample_rows(m: int, rng: random.Random, count: int = 256, edge: int = 8, stripe: int = 64) -> list[int]:
    """Rows of an M-row output to re-check after timing, drawn fresh from rng (per candidate, so that no kernel
    can be tuned to a fixed sample): the first and last `edge` rows (where tails and off-by-ones land), one
    contiguous random stripe (a CTA's or a persistent wave's neighbourhood) and random rows up to `count`."""
    if m <= count:
        return list(range(m))
    rows = set(range(edge)) | set(range(m - edge, m))
    start = rng.randrange(m - stripe + 1)
    rows |= set(range(start, start + stripe))
    rest = [r for r in rng.sample(range(m), min(m, count + len(rows))) if r not in rows]
    rows |= set(rest[:max(0, count - len(rows))])
    return sorted(rows)


def refill(inputs: Mapping[str, Any], fresh: Mapping[str, Any]) -> None:
    """Copy new values into the existing input tensors, keeping their addresses."""
    for k, v in fresh.items():
        if hasattr(v, "copy_"):
            inputs[k].copy_(v)
