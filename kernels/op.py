"""A torch.library op for any exported problem whose launch recipe declares its op (kernels/recipe.py: the "op"
section names the inputs, the outputs and the scalars):

    from kernel_factory.kernels import op
    silu_mul = op.load("silu_mul")                  # kernels/ops/silu_mul.json, or op.load(name, "path/to.json")
    out = silu_mul(a, b)                            # = torch.ops.kernel_factory.silu_mul(a, b)

load() reads the problem's dispatch table (written by `kernel-factory export --build`), registers
`kernel_factory::<problem>` once per process, with a fake implementation (so that it traces under torch.compile and
opcheck), and returns the op. Inputs are made contiguous; M is the product of the first input's leading dimensions
and N its last, which pick the table's kernel as for RMSNorm. On CUDA tensors of an sm_90 GPU it launches the
table's cubins through runtime.py (on another GPU the shipped source JIT-built there; the kernel tuned on a
shape's first call among the table's kernels, kernels/tune.py); on CPU tensors, or where no
kernel can run, it runs the `reference` given to load() (the plugin's torch reference) and says so once, or says that
it has none. Like everything in kernels/, it imports nothing of the factory's engine or plugins.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from . import recipe as recipes
from . import runtime, tune
from .table import TableError

_LIB = torch.library.Library("kernel_factory", "FRAGMENT")
_OPS: dict[str, "ExportedOp"] = {}       # problem -> the op its registered implementations call
_SCHEMAS: dict[str, str] = {}
_LOCK = threading.Lock()


class OpError(ValueError):
    """A table whose recipes cannot make a library op, or a call the op cannot serve; the message says why."""


@dataclass(frozen=True)
class OpSpec:
    """What the op takes and gives, from the recipes' op section (the same in every kernel of the table)."""

    problem: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, Mapping[str, Any]], ...]
    scalars: tuple[tuple[str, float], ...]

    def schema(self) -> str:
        args = [f"Tensor {name}" for name in self.inputs] + [f"float {n}={float(v)!r}" for n, v in self.scalars]
        outs = [f"Tensor {name}" for name, _ in self.outputs]
        rets = outs[0].split()[0] if len(outs) == 1 else f"({', '.join(outs)})"
        return f"{self.problem}({', '.join(args)}) -> {rets}"


def spec_of(problem: str, data: Mapping[str, Any]) -> OpSpec:
    """The op a table's kernels make, or OpError naming what its recipes cannot express."""
    kernels = data.get("kernels") or {}
    if not kernels:
        raise OpError(f"the {problem} table has no built kernels: export it with --build")
    sections = {}
    for key, rec in sorted(kernels.items()):
        found = rec.get("recipe", {}).get("op")
        if found is None:
            raise OpError(f"the recipe of {key} has no 'op' section (inputs, outputs, scalars): a generic op cannot "
                          "tell its inputs from its outputs; add one to the problem's recipe() "
                          "(docs/adding-a-problem.md, the launch recipe)")
        problems = recipes.check(rec["recipe"])
        if problems:
            raise OpError(f"the recipe of {key}: {problems[0]}")
        sections[key] = found
    first = next(iter(sections.values()))
    other = next((k for k, s in sections.items() if s != first), None)
    if other is not None:
        raise OpError(f"the recipes of {next(iter(sections))} and {other} declare other ops; every kernel of a "
                      "table must take and give the same tensors")
    order = first.get("returns", list(first["outputs"]))
    return OpSpec(problem, tuple(first["inputs"]), tuple((name, first["outputs"][name]) for name in order),
                  tuple(first.get("scalars", {}).items()))


def _rows(first: torch.Tensor) -> tuple[int, int]:
    n = first.shape[-1] if first.dim() else 1
    return (first.numel() // n if n else 0), n


class ExportedOp:
    """One problem's exported kernels as a callable op (see the module docstring)."""

    def __init__(self, problem: str, table_path: str | Path | None = None,
                 reference: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None):
        self.kernels = runtime.Kernels(problem, table_path)
        try:
            data = self.kernels.table.data
        except TableError as exc:
            raise OpError(str(exc)) from exc
        self.spec = spec_of(problem, data)
        self.reference = reference
        self._launchers: dict[tuple, runtime.Launcher] = {}
        self._warned: set[str] = set()

    def __call__(self, *tensors: torch.Tensor, **scalars: float) -> Any:
        given = [float(scalars.pop(name, default)) for name, default in self.spec.scalars]
        if scalars or len(tensors) != len(self.spec.inputs):
            raise OpError(f"{self.spec.problem} takes {', '.join(self.spec.inputs)}"
                          + (f" and the scalars {', '.join(n for n, _ in self.spec.scalars)}" if self.spec.scalars
                             else "") + f"; got {len(tensors)} tensors and {sorted(scalars) or 'no other'} scalars")
        return getattr(torch.ops.kernel_factory, self.spec.problem)(*tensors, *given)

    # ---- what the registered implementations call ------------------------------------------------------------------

    def outputs(self, inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """Fresh output tensors: like an input, or of a dtype (a torch dtype name or an input's name) and a shape of
        recipe expressions in M, N, the scalars and the inputs' sizes."""
        first = inputs[self.spec.inputs[0]]
        m, n = _rows(first)
        layouts = {k: (tuple(t.shape), tuple(t.stride())) for k, t in inputs.items()}
        env = recipes.names({"op": {"scalars": dict(scalars)}}, m, n, None, None, layouts)
        out = {}
        for name, spec in self.spec.outputs:
            if "like" in spec:
                like = inputs[spec["like"]]
                out[name] = like.new_empty(like.shape)
            else:
                dtype = inputs[spec["dtype"]].dtype if spec["dtype"] in inputs else getattr(torch, spec["dtype"])
                out[name] = first.new_empty([recipes.value(d, env) for d in spec["shape"]], dtype=dtype)
        return out

    def run(self, args: tuple) -> Any:
        """The op on real tensors: the kernels on a GPU that runs them, else the reference."""
        inputs = {name: t.contiguous() for name, t in zip(self.spec.inputs, args)}
        scalars = {name: float(v) for (name, _), v in zip(self.spec.scalars, args[len(self.spec.inputs):])}
        outputs = self.outputs(inputs, scalars)
        first = inputs[self.spec.inputs[0]]
        m, n = _rows(first)
        dtype = runtime.DTYPE_NAMES.get(str(first.dtype), str(first.dtype).removeprefix("torch."))
        why = f"tensors on {first.device.type}" if not first.is_cuda else \
            self.kernels.why_not(first.get_device(), dtype, torch.cuda.get_device_capability)
        if why is None and m * n:
            self._launch(first.get_device(), dtype, m, n, scalars, {**inputs, **outputs})
        elif why is not None:
            self._reference(inputs, outputs, why)
        return self._result(outputs)

    def _result(self, outputs: Mapping[str, torch.Tensor]) -> Any:
        values = tuple(outputs[name] for name, _ in self.spec.outputs)
        return values[0] if len(values) == 1 else values

    def _reference(self, inputs: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor], why: str) -> None:
        if self.reference is None:
            raise OpError(f"kernel_factory::{self.spec.problem} cannot run its kernels here ({why}) and was loaded "
                          "without a reference: pass reference= to op.load() for a torch fallback")
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"kernel_factory {self.spec.problem}: runs its torch reference ({why})", RuntimeWarning,
                          stacklevel=5)
        got = self.reference(dict(inputs))
        for name, out in outputs.items():
            out.copy_(got[name].to(out.dtype).reshape(out.shape))

    def _launch(self, index: int, dtype: str, m: int, n: int, scalars: Mapping[str, float],
                tensors: dict[str, torch.Tensor]) -> None:
        runtime._context(index)
        kernel = self.kernels.kernel(dtype, m, n)
        if tune.enabled():
            kernel, _ = self.kernels.tuned(index, dtype, m, n, kernel, lambda k: runtime.runner(
                self._made(index, k, dtype, m, n, scalars, tensors), index, tensors))
        launcher = self._made(index, kernel, dtype, m, n, scalars, tensors)
        first = tensors[self.spec.inputs[0]]
        for name, (buf_dtype, shape) in launcher.buffers.items():
            tensors[name] = first.new_empty(shape, dtype=getattr(torch, buf_dtype))
        launcher.launch(torch._C._cuda_getCurrentRawStream(index), tensors)

    def _made(self, index: int, kernel: runtime.Kernel, dtype: str, m: int, n: int, scalars: Mapping[str, float],
              tensors: Mapping[str, torch.Tensor]) -> runtime.Launcher:
        asked = recipes.queried(kernel.recipe)
        aligned = {k: tensors[k].data_ptr() if k in tensors else 256 for k in sorted(asked["align"])}
        layouts = {k: (tuple(tensors[k].shape), tuple(tensors[k].stride())) for k in sorted(asked["layout"])
                   if k in tensors}
        key = (index, kernel.genome, dtype, m, n, tuple(sorted(scalars.items())), tuple(sorted(layouts.items())),
               tuple(recipes.alignment(a) for a in aligned.values()))
        launcher = self._launchers.get(key)
        if launcher is None:
            plan = recipes.evaluate(kernel.recipe, m, n, None, aligned, layouts, scalars)
            launcher = self._launchers[key] = runtime.Launcher(self.kernels.loaded(kernel, index), plan)
        return launcher

    def fake(self, args: tuple) -> Any:
        inputs = dict(zip(self.spec.inputs, args))
        scalars = {name: v for (name, _), v in zip(self.spec.scalars, args[len(self.spec.inputs):])}
        return self._result(self.outputs(inputs, scalars))


def _register(spec: OpSpec) -> None:
    """Define kernel_factory::<problem> once per process; its implementations call the problem's current op."""
    name = spec.problem
    if name in _SCHEMAS:
        if _SCHEMAS[name] != spec.schema():
            raise OpError(f"kernel_factory::{name} is registered in this process as {_SCHEMAS[name]}; this table "
                          f"makes {spec.schema()}: restart to load it")
        return
    if hasattr(torch.ops.kernel_factory, name):
        raise OpError(f"kernel_factory::{name} is already an op (a hand-written one, e.g. kernels/rmsnorm.py)")
    _LIB.define(spec.schema())
    _LIB.impl(name, lambda *args: _OPS[name].run(args), "CUDA")
    _LIB.impl(name, lambda *args: _OPS[name].run(args), "CPU")
    torch.library.register_fake(f"kernel_factory::{name}", lambda *args: _OPS[name].fake(args), lib=_LIB)
    _SCHEMAS[name] = spec.schema()


def load(problem: str, table_path: str | Path | None = None,
         reference: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None) -> ExportedOp:
    """The exported op of `problem` from its table (default kernels/ops/<problem>.json), registered as
    torch.ops.kernel_factory.<problem>; `reference` (inputs by name -> outputs by name, e.g. the plugin's reference)
    serves CPU tensors and GPUs the kernels cannot run on. A later load of the same problem replaces the table the
    registered op runs."""
    found = ExportedOp(problem, table_path, reference)
    with _LOCK:
        _register(found.spec)
        _OPS[problem] = found
    return found
