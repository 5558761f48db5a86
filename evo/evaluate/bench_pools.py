"""The benchmark input pools of a GPU worker: each benchmark case's input sets (fixed seeds, fenced by canaries) and
its guarded outputs, made once and reused by every candidate. A worker makes them all up front; when they do not
fit in GPU memory together (an fp32 panel of wide rows with the benchmark rows), the rest are made on demand and the
least recently used freed to make room: the same seeds make them again, identical, when next needed. Only a case
that does not fit alone stops the worker, with what to change."""
from __future__ import annotations

import sys
from typing import Any, Callable, Mapping, Sequence

from . import gate
from ..protocols import Problem
from ..types import Case

ROTATE_BELOW_BYTES = 2**30  # benchmark cases with less input than this get a second input set to rotate through


class Pool:
    """A benchmark case's input sets (allocated once per worker, fixed seeds) and its guarded outputs."""

    def __init__(self, problem: Problem, case: Case):
        import torch
        gen = torch.Generator("cuda").manual_seed(7)
        first = problem.make_inputs(case, seed=12345, device="cuda")
        size = sum(t.numel() * t.element_size() for t in first.values() if hasattr(t, "numel"))
        sets = [first] + ([problem.make_inputs(case, seed=54321, device="cuda")] if size < ROTATE_BELOW_BYTES else [])
        # Inputs fenced by canaries too: a write past the end of x or w during timing is seen after it.
        self.input_guards = [gate.Guarded(s, gen, copy=True) for s in sets]
        self.inputs = [g.views for g in self.input_guards]
        del first, sets
        self.guarded = gate.Guarded(problem.make_outputs(case, "cuda"), gen)
        self.checksums = [checksum(i) for i in self.inputs]
        self.nbytes = size * len(self.inputs) + sum(t.numel() * t.element_size()
                                                    for t in self.guarded.views.values() if hasattr(t, "numel"))


class SetupError(Exception):
    """The worker cannot start for a reason the user can act on: reported as its message, without a traceback."""


class Pools:
    """The pools a worker holds, by case, in the order last used; `make(case)` makes one, `release()` returns freed
    memory to the driver. A pool that does not fit frees the least recently used until it does."""

    def __init__(self, make: Callable[[Case], Any], release: Callable[[], None]):
        self.make, self.release = make, release
        self.held: dict[str, Any] = {}
        self.remade = 0   # pools made again after being freed for room

    def get(self, case: Case, evict: bool = True) -> Any:
        import torch
        if case.key in self.held:
            self.held[case.key] = self.held.pop(case.key)   # now the most recently used
            return self.held[case.key]
        while True:
            try:
                made = self.make(case)
                break
            except torch.OutOfMemoryError:
                if not evict or not self.held:
                    raise
                self.held.pop(next(iter(self.held)))
                self.remade += 1
                self.release()
        self.held[case.key] = made
        return made


def allocate_pools(pools: Pools, cases: Sequence[Case], gpu_bytes: int) -> None:
    """Make every benchmark case's pool up front while they fit together; the rest are made on demand (Pools.get).
    A case that does not fit alone is a SetupError saying what to change."""
    import torch
    held = 0
    for i, case in enumerate(cases):
        try:
            held += pools.get(case, evict=False).nbytes
        except torch.OutOfMemoryError as exc:
            pools.release()
            if i == 0 or not _fits_alone(pools, case):
                raise SetupError(
                    f"benchmark case {case.key} does not fit in GPU memory ({gpu_bytes / 2**30:.0f} GiB on the GPU) "
                    f"even alone: measure narrower cases (-o shapes=MxN,...)") from exc
            print(f"worker: the pools of {i} of {len(cases)} benchmark cases fit together ({held / 2**30:.1f} GiB of "
                  f"inputs and outputs); the rest are made when used, the least recently used freed for room",
                  file=sys.stderr)
            return


def _fits_alone(pools: Pools, case: Case) -> bool:
    """Whether the case's pool can be made once every other pool is freed (it is then held)."""
    import torch
    try:
        pools.get(case)
        return True
    except torch.OutOfMemoryError:
        return False


def checksum(inputs: Mapping[str, Any]) -> dict[str, int]:
    import torch
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return {k: int(v.view(ints[v.element_size()]).sum(dtype=torch.int64)) for k, v in inputs.items()
            if hasattr(v, "element_size")}
