"""The running half of `kernel-factory check`, on the CPU: a problem plugin's inputs, reference (every dtype), row
independence, adversarial inputs, launch plans within CUDA's limits at every shape, launch recipe and baselines.
Each broken rule raises CheckFailed (check_contract) with the rule's name and one line."""
from __future__ import annotations

import contextlib
import random
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from .. import compiled
from ..protocols import (SHAPE_SETS, Launch, LaunchRecipe, MissingBaseline, Problem, RowReference, SpecialInputs,
                         launch_from_recipe, launch_steps)
from ..types import Case, GeneValue
from .check_contract import fail, kernel_defined, offers, output_tolerances

# CUDA's limits on sm_90: grid x < 2^31, y and z <= 65535; a block of at most 1024 threads (z <= 64); dynamic
# shared memory up to the 227 KB opt-in; clusters of up to 16 CTAs (8 portable).
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SMEM = 227 * 1024
MAX_CLUSTER = 16
ROWS_PICKED = 3   # rows of a case the row-independence check keeps
LIMIT_GENOMES = 64   # genomes whose launch plans are checked at every shape of every set


def _differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def seeded_inputs(prob: Problem, case: Case) -> dict[str, Any]:
    a, b, c = (prob.make_inputs(case, seed, "cpu") for seed in (11, 11, 12))
    if _differ(a, b):
        fail("seeded-inputs", f"{case.key}: make_inputs gives other inputs for the same seed (draw everything from "
                              "a torch.Generator seeded with `seed`)")
    if not _differ(a, c):
        fail("seeded-inputs", f"{case.key}: make_inputs gives the same inputs for another seed")
    off = [k for k, v in a.items() if isinstance(v, torch.Tensor) and v.device.type != "cpu"]
    if off:
        fail("seeded-inputs", f"{case.key}: make_inputs(device='cpu') put {off[0]!r} on {a[off[0]].device}; use the "
                              "device argument")
    return a


def reference(prob: Problem, case: Case, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    outs, ref = prob.make_outputs(case, "cpu"), prob.reference(inputs)
    if not ref:
        fail("reference", f"{case.key}: reference() returned no outputs")
    for key, value in ref.items():
        if key not in outs or tuple(outs[key].shape) != tuple(value.shape):
            fail("reference", f"{case.key}: reference output {key!r} {tuple(value.shape)} has no buffer of its shape "
                              f"in make_outputs (it gives {', '.join(outs) or 'none'})")
        if value.dtype not in (torch.float32, torch.float64):
            fail("reference", f"{case.key}: reference output {key!r} is {value.dtype}; compute it in fp32 or wider "
                              "(the kernel's rounding is what the tolerance allows for)")
        if not torch.isfinite(value).all():
            fail("reference", f"{case.key}: reference output {key!r} is not finite on make_inputs' values")
    return outs, ref


def _close(got: Any, want: Any, atol: float, rtol: float) -> bool:
    got, want = got.float(), want.float()
    return tuple(got.shape) == tuple(want.shape) and bool(
        ((got - want).abs() <= atol + rtol * want.abs()).all() and torch.isfinite(got).all())


def _tol(prob: Problem, name: str, dtype: str) -> tuple[float, float]:
    per_output = getattr(prob, "output_tolerance", None)
    return (per_output(name, dtype) if per_output is not None else None) or prob.tolerance(dtype)


def rows(prob: Problem, case: Case, inputs: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """The timed-output re-check compares sampled rows of an output with the reference of those rows alone: true only
    if each output row depends on the same input row (first dimension M = shape[0]), or where the problem computes
    its reference at chosen rows itself (RowReference)."""
    m = case.shape[0]
    if m < 2:
        return ""
    idx = torch.tensor(sorted(random.Random(m).sample(range(m), min(ROWS_PICKED, m - 1)), reverse=True))
    if isinstance(prob, RowReference):
        stray = [k for k in prob.row_outputs if k not in ref]
        if stray:
            fail("row-reference", f"row_outputs names {stray}, which reference() does not return")
        got, by_rows, rule = prob.reference_rows(inputs, idx), set(prob.row_outputs), "row-reference"
    else:
        pick = {k: v.index_select(0, idx) if isinstance(v, torch.Tensor) and v.dim() > 1 and v.shape[0] == m else v
                for k, v in inputs.items()}
        got, rule = prob.reference(pick), "row-wise"
        by_rows = {k for k, v in ref.items() if v.dim() >= 1 and v.shape[0] == m}
    for name, full in ref.items():
        want = full.index_select(0, idx) if name in by_rows else full
        if name not in got or not _close(got[name], want, *_tol(prob, name, case.dtype)):
            how = ("reference_rows(inputs, rows) differs from reference() at those rows" if rule == "row-reference"
                   else "the reference of a few rows alone differs from those rows of the full reference: an output "
                        "row depends on other rows, and the timed-output re-check would reject correct kernels; "
                        "offer row_outputs and reference_rows (RowReference)")
            fail(rule, f"{case.key}: output {name!r}: {how}")
    return "rows independent" if rule == "row-wise" else "reference_rows agrees"


def special(prob: Problem, case: Case, inputs: Mapping[str, Any]) -> str:
    if not isinstance(prob, SpecialInputs) or not offers(prob, "special_inputs"):
        return ""
    a, b, c = (prob.special_inputs(case, seed, "cpu") for seed in (11, 11, 12))
    for key, want in inputs.items():
        got = a.get(key)
        if not isinstance(want, torch.Tensor):
            continue
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            fail("special-inputs", f"{case.key}: special_inputs()[{key!r}] is not a tensor of make_inputs' shape "
                                   f"{tuple(want.shape)} and dtype {want.dtype}")
    if set(a) != set(inputs):
        fail("special-inputs", f"{case.key}: special_inputs() gives {sorted(a)}, make_inputs gives {sorted(inputs)}")
    if _differ(a, b) or not _differ(a, c):
        fail("special-inputs", f"{case.key}: special_inputs() must give the same inputs for a seed and others for "
                               "another seed")
    bad = [k for k, v in prob.reference(a).items() if not torch.isfinite(v).all()]
    if bad:
        fail("special-inputs", f"{case.key}: the reference of special_inputs() output {bad[0]!r} is not finite: a "
                               "NaN reference passes any kernel, so the gate would check nothing there")
    return "special inputs ok"


def launch_faults(prob: Problem, steps: Sequence[Any], template: str) -> str | None:
    """Why a launch plan cannot run on sm_90, or None."""
    if not steps:
        return "launch() gave no steps"
    for step in steps:
        if not isinstance(step, Launch):
            return f"launch() gave a {type(step).__name__}, not a Launch"
        dims = (("grid", step.grid, MAX_GRID), ("block", step.block, MAX_BLOCK))
        for what, got, limit in dims:
            if len(got) != 3 or any(type(g) is not int and not isinstance(g, np.integer) for g in got):
                return f"{what} {got!r} is not three ints"
            if any(g < 1 or g > hi for g, hi in zip(got, limit)):
                return f"{what} {tuple(got)} is outside CUDA's limits (1 to {limit} per dimension)"
        if int(np.prod(step.block)) > MAX_THREADS:
            return f"block {tuple(step.block)} has {int(np.prod(step.block))} threads; at most {MAX_THREADS}"
        if not 0 <= step.shared_bytes <= MAX_SMEM:
            return f"shared_bytes {step.shared_bytes} is outside 0 to {MAX_SMEM} (sm_90's opt-in limit)"
        if step.cluster is not None and (int(np.prod(step.cluster)) > MAX_CLUSTER or any(
                g % c for g, c in zip(step.grid, step.cluster))):
            return f"cluster {step.cluster} must divide grid {step.grid} and hold at most {MAX_CLUSTER} CTAs"
        untyped = [a for a in step.args if not isinstance(a, (torch.Tensor, np.generic))]
        if untyped:
            return f"untyped kernel argument {untyped[0]!r} (a tensor, or a numpy scalar such as np.int32(n))"
        if not kernel_defined(template, step.kernel or prob.kernel_name):
            return f"step kernel {step.kernel!r} is not an extern \"C\" __global__ kernel of the template"
    return None


def some(chosen: Sequence[Mapping[str, GeneValue]], seed: int) -> list[Mapping[str, GeneValue]]:
    """At most LIMIT_GENOMES of the chosen genomes (the first, the defaults, kept) for the launch limits at every
    shape: with --all the compiles take every genome, the launch plans a seeded sample."""
    if len(chosen) <= LIMIT_GENOMES:
        return list(chosen)
    return [chosen[0], *random.Random(seed).sample(list(chosen[1:]), LIMIT_GENOMES - 1)]


@contextlib.contextmanager
def _fake() -> Iterator[None]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def launch_limits(prob: Problem, chosen: Sequence[Mapping[str, GeneValue]], template: str) -> str:
    """Every chosen genome's launch plan at every shape of every set, in every dtype, on fake tensors (shapes
    without memory, so that the widest benchmark rows cost nothing)."""
    plans, cases = 0, [Case(s, d) for d in prob.dtypes for key in SHAPE_SETS for s in prob.shape_sets[key]]
    for case in cases:
        moved = prob.bytes_moved(case)
        if not isinstance(moved, (int, np.integer)) or isinstance(moved, bool) or moved <= 0:
            fail("bytes-moved", f"{case.key}: bytes_moved() = {moved!r}; it must be a positive int")
    try:
        with _fake():
            for case in cases:
                inputs, outs = prob.make_inputs(case, 0, "cpu"), prob.make_outputs(case, "cpu")
                for genes in chosen:
                    bad = launch_faults(prob, launch_steps(prob.launch(genes, case, inputs, outs)), template)
                    if bad:
                        fail("launch", f"{case.key} {dict(genes)}: {bad}")
                    plans += 1
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return (f"launch plans: checked on the correctness shapes only (launch() cannot run on fake tensors: "
                f"{type(exc).__name__}: {str(exc)[:120]})")
    return f"launch plans: {plans} within CUDA's limits ({len(chosen)} genomes x {len(cases)} cases)"


def recipe(prob: Problem, case: Case, inputs: Mapping[str, Any], outs: Mapping[str, Any]) -> str:
    if not isinstance(prob, LaunchRecipe) or not offers(prob, "recipe"):
        return ""
    from ...kernels import recipe as recipes
    genes = prob.space.defaults()
    spec = prob.recipe(genes, case.dtype)
    problems = recipes.check(spec)
    if problems:
        fail("recipe", f"recipe(defaults, {case.dtype!r}): {problems[0]}")
    mine = launch_from_recipe(spec, case, {**inputs, **outs})
    theirs = launch_steps(prob.launch(genes, case, inputs, outs))
    shape = [(s.grid, s.block, s.shared_bytes, s.kernel or prob.kernel_name, len(s.args)) for s in theirs]
    if [(s.grid, s.block, s.shared_bytes, s.kernel or prob.kernel_name, len(s.args)) for s in mine] != shape:
        fail("recipe", f"{case.key}: launch() and recipe() give other plans for the defaults (export would launch "
                       "another kernel geometry than the one the factory timed); launch from the recipe")
    return "recipe = launch()"


def cpu_checks(prob: Problem, shapes: int, template: str, emit: Callable[[str], None]) -> None:
    """Inputs, reference, rows, special inputs, launches and recipe on `shapes` correctness shapes, every dtype."""
    for dtype in prob.dtypes:
        for shape in prob.shape_sets["correctness"][:shapes]:
            case = Case(shape, dtype)
            inputs = seeded_inputs(prob, case)
            outs, ref = reference(prob, case, inputs)
            output_tolerances(prob, ref)
            bad = launch_faults(prob, launch_steps(prob.launch(prob.space.defaults(), case, inputs, outs)), template)
            if bad:
                fail("launch", f"{case.key}: {bad}")
            done = ["inputs follow the seed", "reference finite fp32", rows(prob, case, inputs, ref),
                    special(prob, case, inputs), recipe(prob, case, inputs, outs)]
            emit(f"cpu {case.key}: {', '.join(d for d in done if d)}")


@contextlib.contextmanager
def _eager_compiles() -> Iterator[None]:
    """torch.compile baselines trace through dynamo with the eager backend here (the graph is captured and checked,
    no code is generated: no C++ compiler needed, seconds not minutes)."""
    before, compiled.COMPILE_BACKEND = compiled.COMPILE_BACKEND, "eager"
    try:
        yield
    finally:
        compiled.COMPILE_BACKEND = before


def unknown(prob: Problem, case: Case, inputs: Mapping[str, Any]) -> None:
    try:
        prob.baseline("no_such_baseline", case, inputs)
    except MissingBaseline:
        return
    except Exception as exc:   # noqa: BLE001 - what the plugin raised is the finding
        fail("baselines", f"baseline('no_such_baseline', ...) raised {type(exc).__name__}: {exc}; an unknown name "
                          "must raise MissingBaseline")
    fail("baselines", "baseline('no_such_baseline', ...) returned: an unknown name must raise MissingBaseline")


def baselines(prob: Problem) -> str:
    """Each baseline on the first correctness case of the first dtype, on the CPU, against the reference."""
    case = Case(prob.shape_sets["correctness"][0], prob.dtypes[0])
    inputs = prob.make_inputs(case, 21, "cpu")
    ref = prob.reference(inputs)
    unknown(prob, case, inputs)
    ran, skipped = [], []
    with _eager_compiles(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a library op's "runs its torch reference on the CPU" is expected here
        for name in prob.baselines:
            try:
                fn = prob.baseline(name, case, inputs)
            except MissingBaseline as exc:
                skipped.append(f"{name} ({str(exc)[:100]})")
                continue
            except Exception as exc:   # noqa: BLE001 - a baseline for GPU tensors only
                skipped.append(f"{name} (cannot run on the CPU: {type(exc).__name__}: {str(exc)[:80]})")
                continue
            if not callable(fn):
                fail("baseline-runs", f"baseline({name!r}, ...) returned a {type(fn).__name__}; it returns a "
                                      "zero-argument callable")
            try:
                out = fn()
            except compiled.NotCompiled as exc:
                fail("baseline-runs", f"baseline {name!r}: {exc}")
            except Exception as exc:   # noqa: BLE001
                skipped.append(f"{name} (cannot run on the CPU: {type(exc).__name__}: {str(exc)[:80]})")
                continue
            shared = [k for k in (out if isinstance(out, Mapping) else {}) if k in ref]
            if not shared:
                fail("baseline-runs", f"baseline {name!r} returns none of the reference's outputs ({', '.join(ref)})")
            for key in shared:
                if not _close(out[key], ref[key], *_tol(prob, key, case.dtype)):
                    fail("baseline-runs", f"baseline {name!r} output {key!r} differs from the reference on "
                                          f"{case.key}: speedups over it would compare unlike work")
            ran.append(name)
    return (f"baselines on the CPU ({case.key}): {', '.join(ran) or 'none'} match the reference"
            + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
