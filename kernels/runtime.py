"""Run exported genomes from a library op: choose the genome from the problem's dispatch table (kernels/ops/), get its
cubin (prebuilt next to the table, else compiled once with NVRTC into a per-user cache), load it once per device and
launch the problem's plan on torch's current stream. Needs an sm_90 GPU to launch; choosing and compiling do not."""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from ..evo.tools import dispatch
from ..evo.evaluate import render
from ..evo.evaluate.compile import CompileCache, CompileOutput, cache_key, nvrtc_version
from ..evo.tools.export import adapt, problem_plugin
from ..evo.protocols import Launch, Problem, launch_steps
from ..evo.types import BuildInfo, Case, Genome

OPS_DIR = Path(__file__).resolve().parent / "ops"
ARCH_CAPABILITY = (9, 0)   # the cubins are sm_90a: H100 / H200 only


class ScalarNotPassed(RuntimeError):
    """The problem's launch() does not pass a scalar the op must set (e.g. a template that hard-codes eps)."""


def cache_dir() -> Path:
    """Where JIT-compiled cubins are kept: the platform's per-user cache folder (XDG), kernel-factory/ops."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-factory" / "ops"


_CAPABILITY: dict[int, tuple[int, int]] = {}


def why_not_gpu(device: Any) -> str | None:
    """None when tensors on `device` can run the compiled kernels, else why not (they use the torch reference)."""
    if getattr(device, "type", None) != "cuda":
        return f"tensors on {device}, not on a CUDA device"
    import torch
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABILITY:
        _CAPABILITY[index] = torch.cuda.get_device_capability(index)
    if _CAPABILITY[index] != ARCH_CAPABILITY:
        major, minor = _CAPABILITY[index]
        return f"cuda:{index} is sm_{major}{minor}; the kernels are built for sm_90a"
    return None


def with_scalar(plan: Launch | tuple[Launch, ...], old: Any, new: Any) -> tuple[tuple[Launch, ...], int]:
    """The plan with every scalar argument of old's type and value replaced by new, and how many were replaced
    (how an op passes its caller's eps to a problem whose launch() uses the problem's eps)."""
    steps, count = [], 0
    for step in launch_steps(plan):
        args = []
        for arg in step.args:
            hit = type(arg) is type(old) and arg == old
            count += hit
            args.append(new if hit else arg)
        steps.append(replace(step, args=tuple(args)))
    return tuple(steps), count


class Kernels:
    """One problem's exported genomes, as a library op runs them. Loads the problem, its table and cubins lazily."""

    def __init__(self, problem_name: str, table_path: str | Path | None = None):
        self.problem_name = problem_name
        self.table_path = Path(table_path) if table_path else OPS_DIR / f"{problem_name}.json"
        self._problem: Problem | None = None
        self._table: dict[str, Any] | None = None
        self._table_read = False
        self._modules: dict[tuple[str, str, int], Any] = {}
        self._choices: dict[tuple[str, int], tuple[Genome, str]] = {}
        self._prepared: dict[tuple, tuple[Genome, Any]] = {}   # plan key -> (genome, launcher.Prepared)
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        """Why this problem's kernels cannot be used at all (its plugin does not load), or None."""
        try:
            self.problem
        except Exception as exc:   # a missing or broken plugin: the op falls back to its torch reference
            return f"problem {self.problem_name!r} does not load: {exc}"
        return None

    @property
    def problem(self) -> Problem:
        if self._problem is None:
            self._problem = problem_plugin(self.problem_name)
        return self._problem

    @property
    def table(self) -> dict[str, Any] | None:
        """The dispatch table, or None when it has not been exported yet (a broken table raises TableError)."""
        if not self._table_read:
            self._table = dispatch.load(self.table_path) if self.table_path.is_file() else None
            self._table_read = True
        return self._table

    def choose(self, dtype: str, n: int) -> tuple[Genome, str]:
        """The genome for rows of width n in dtype, and why: an exact table entry, the dtype's general genome, or
        the problem's default genome (no table, or no entry for this dtype). Decided once per (dtype, n)."""
        if (dtype, n) not in self._choices:
            self._choices[(dtype, n)] = self._choose(dtype, n)
        return self._choices[(dtype, n)]

    def _choose(self, dtype: str, n: int) -> tuple[Genome, str]:
        found = dispatch.lookup(self.table, dtype, n) if self.table is not None else None
        if found is None:
            why = "no dispatch table" if self.table is None else f"the table has no {dtype} entry"
            return Genome.of(self.problem.space.defaults()), f"default genome ({why})"
        # A table exported before genes were added: the new genes take their defaults (as export does).
        genome, filled, why = adapt(found[0].gene_dict, found[0].patch_dict, self.problem)
        if genome is None:
            return Genome.of(self.problem.space.defaults()), f"default genome (table genome {found[0].id}: {why})"
        return genome, found[1] + (f", genes {list(filled)} at their defaults" if filled else "")

    def cubin(self, genome: Genome, dtype: str) -> bytes:
        """The prebuilt cubin when it matches today's template, else an NVRTC build cached under cache_dir()."""
        if self.table is not None:
            cubin = dispatch.prebuilt(self.problem, self.table, self.table_path, genome, dtype)
            if cubin is not None:
                return cubin
        cache = CompileCache(cache_dir())
        key = cache_key(render.body(self.problem, genome, dtype), nvrtc_version())
        hit = cache.get(key)
        if hit is not None and hit.cubin is not None:
            return hit.cubin
        cubin = dispatch.compile_cubin(self.problem, genome, dtype)
        cache.put(CompileOutput(key, cubin, BuildInfo(), None))
        return cubin

    def module(self, genome: Genome, dtype: str, device_index: int) -> Any:
        """The loaded cubin for (genome, dtype) on one device, loaded once."""
        key = (genome.id, dtype, device_index)
        with self._lock:
            if key not in self._modules:
                from ..evo.evaluate.launcher import Module
                self._modules[key] = Module(self.cubin(genome, dtype), self.problem.kernel_name)
            return self._modules[key]

    def plan(self, case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
             scalars: Mapping[Any, Any] | None = None) -> tuple[Genome, tuple[Launch, ...]]:
        """The chosen genome and its launch steps for `case`; scalars maps problem-side scalar arguments to the
        caller's values (e.g. eps). Needs no GPU."""
        genome, _ = self.choose(case.dtype, case.shape[-1])
        steps = launch_steps(self.problem.launch(genome.gene_dict, case, inputs, outputs))
        for old, new in (scalars or {}).items():
            steps, count = with_scalar(steps, old, new)
            if count == 0 and new != old:
                raise ScalarNotPassed(f"{self.problem_name}.launch() passes no scalar {old!r} to replace with {new!r}")
        return genome, steps

    def run(self, case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
            scalars: Mapping[Any, Any] | None = None) -> Genome:
        """Launch the plan on torch's current stream of the inputs' device. Returns the genome that ran.

        The plan is made once per (dtype, shape, device, pointer alignments, scalars): later calls only put their
        tensors' addresses into the cached launches (the problem's launch() sees nothing else of a tensor)."""
        import torch
        from ..evo.evaluate.launcher import Prepared, torch_stream
        tensors = {**inputs, **outputs}
        addresses = {name: t.data_ptr() for name, t in tensors.items() if hasattr(t, "data_ptr")}
        device = next(t.device for t in tensors.values() if hasattr(t, "device"))
        current = torch.cuda.current_device()
        index = device.index if device.index is not None else current
        key = (case.dtype, case.shape, index, alignments(addresses), tuple(scalars.items()) if scalars else ())
        found = self._prepared.get(key)
        if found is None:
            genome, steps = self.plan(case, inputs, outputs, scalars)
            with torch.cuda.device(index):
                found = (genome, Prepared(self.module(genome, case.dtype, index), steps,
                                          {id(t): name for name, t in tensors.items()}))
            if len(self._prepared) > 1024:
                self._prepared.clear()
            self._prepared[key] = found
        genome, prepared = found
        if index == current:
            prepared.launch(torch_stream(index), addresses)
        else:
            with torch.cuda.device(index):
                prepared.launch(torch_stream(index), addresses)
        return genome


def alignments(addresses: Mapping[str, int]) -> tuple[int, ...]:
    """Each tensor's address modulo 16: all a launch plan may derive from a pointer (its vector widths)."""
    return tuple(a % 16 for a in addresses.values())


def problem_constant(problem: Problem, name: str, default: Any = None) -> Any:
    """A module-level constant of the problem's plugin module (e.g. its EPS), or default."""
    return getattr(sys.modules.get(type(problem).__module__), name, default)
