"""`kernel-factory check PROBLEM`: what a plugin author can learn without a GPU. It checks the plugin's contract,
runs its reference and input generator on the CPU for a few shapes, renders and NVRTC-compiles a sample of its
genomes (or all of them) for the target arch, and reports ptxas resources and the gene values that never compile.
It stops at the first problem, with one line that names it."""
from __future__ import annotations

import logging
import random
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import torch

from .. import registry
from ..evaluate import render
from ..evaluate.compile import ARCH, CompileJob, compile_one
from ..protocols import SHAPE_SETS, Launch, Problem, launch_steps
from ..types import Candidate, Case, Genome

log = logging.getLogger("kernel_factory.check")


class CheckFailed(Exception):
    """The first problem found, as one line."""


def contract(name: str) -> Problem:
    prob = registry.load("problem", name)
    if not isinstance(prob, Problem):
        raise CheckFailed(f"{name}: the entry point gives a {type(prob).__name__}, which lacks Problem's attributes "
                          "(see kernel_factory.evo.protocols.Problem)")
    missing = [s for s in SHAPE_SETS if not prob.shape_sets.get(s)]
    if missing:
        raise CheckFailed(f"{name}: shape_sets needs non-empty {', '.join(missing)} (valid: {', '.join(SHAPE_SETS)})")
    if not prob.dtypes or not prob.baselines:
        raise CheckFailed(f"{name}: dtypes and baselines must each name at least one")
    why = prob.space.why_infeasible(prob.space.defaults())
    if why:
        raise CheckFailed(f"{name}: the template's gene defaults are infeasible: {why}")
    if prob.kernel_name not in prob.template():
        raise CheckFailed(f"{name}: kernel_name {prob.kernel_name!r} does not occur in the template")
    for dtype in prob.dtypes:
        atol, rtol = prob.tolerance(dtype)
        if not (0 < atol < 1 and 0 < rtol < 0.1):
            raise CheckFailed(f"{name}: tolerance({dtype!r}) = ({atol}, {rtol}); need 0 < atol < 1, 0 < rtol < 0.1")
    return prob


def cpu_checks(prob: Problem, shapes: int) -> list[str]:
    """Inputs follow their seed, the reference is finite and fits the output buffers, launches are typed."""
    lines = []
    for shape in prob.shape_sets["correctness"][:shapes]:
        case = Case(shape, prob.dtypes[0])
        a, b, c = (prob.make_inputs(case, seed, "cpu") for seed in (1, 1, 2))
        if any(not torch.equal(a[k], b[k]) for k in a):
            raise CheckFailed(f"{case.key}: make_inputs gives other inputs for the same seed")
        if all(torch.equal(a[k], c[k]) for k in a):
            raise CheckFailed(f"{case.key}: make_inputs gives the same inputs for another seed")
        outs, ref = prob.make_outputs(case, "cpu"), prob.reference(a)
        for key, value in ref.items():
            if key not in outs or outs[key].shape != value.shape:
                raise CheckFailed(f"{case.key}: reference output {key!r} has no output buffer of its shape")
            if not torch.isfinite(value).all():
                raise CheckFailed(f"{case.key}: reference output {key!r} is not finite")
        steps = launch_steps(prob.launch(prob.space.defaults(), case, a, outs))
        for step in steps:
            if not isinstance(step, Launch) or any(g < 1 for g in step.grid):
                raise CheckFailed(f"{case.key}: launch() must give Launch steps with a grid of at least 1")
            untyped = [arg for arg in step.args if not isinstance(arg, (torch.Tensor, np.generic))]
            if untyped:
                raise CheckFailed(f"{case.key}: untyped kernel argument {untyped[0]!r} (use numpy scalars)")
        lines.append(f"cpu {case.key}: inputs follow the seed, reference finite, {len(steps)} launch step(s)")
    return lines


def genomes(prob: Problem, sample: int | None, seed: int) -> list[dict[str, Any]]:
    """Every feasible genome (sample None), or the template defaults plus a seeded sample of the rest."""
    every = [g for g in prob.space.enumerate() if prob.space.why_infeasible(g) is None]
    if sample is None or sample >= len(every):
        return every
    rest = [g for g in every if g != prob.space.defaults()]
    return [prob.space.defaults(), *random.Random(seed).sample(rest, max(0, sample - 1))]


def compile_all(prob: Problem, chosen: list[dict[str, Any]], dtype: str,
                compile_fn: Callable[[CompileJob], Any] = compile_one) -> tuple[list[str], str | None]:
    """Render and compile each genome; report ptxas ranges and gene values none of whose genomes compiled."""
    built, failures = [], []
    tried: dict[tuple[str, Any], list[bool]] = defaultdict(list)
    for genes in chosen:
        cand = Candidate(Genome.of(genes))
        out = compile_fn(CompileJob(cand.id, render.render(prob, cand, dtype), f"{prob.name}-{cand.id}.cu"))
        for item in genes.items():
            tried[item].append(out.cubin is not None)
        (built if out.cubin is not None else failures).append((genes, out))
    lines = [f"compiled {len(built)}/{len(chosen)} genomes for {ARCH} ({dtype})"]
    if built:
        def span(field: str) -> str:
            values = [getattr(o.info, field) for _, o in built if getattr(o.info, field) is not None]
            return f"{min(values)}-{max(values)}" if values else "n/a"
        lines.append(f"ptxas: registers {span('registers')}, shared bytes {span('shared_bytes')}, spill stores "
                     f"{span('spill_stores')} B, stack {span('local_bytes')} B")
    never = sorted(f"{gene}={value!r}" for (gene, value), ok in tried.items() if not any(ok))
    if never:
        lines.append(f"gene values that never compiled: {', '.join(never)}")
    first = None
    if failures:
        genes, out = failures[0]
        head = next((ln for ln in (out.error or "").splitlines() if "error" in ln), (out.error or "?")[:200])
        first = f"{len(failures)} of {len(chosen)} genomes do not compile; first {genes}: {head.strip()[:300]}"
    return lines, first


def check(name: str, sample: int | None = 16, seed: int = 0, shapes: int = 3,
          compile_fn: Callable[[CompileJob], Any] = compile_one) -> list[str]:
    """The report's lines; CheckFailed at the first problem."""
    prob = contract(name)
    lines = [f"contract: {name} v{prob.version}, {len(list(prob.space.genes))} genes, dtypes "
             f"{'/'.join(prob.dtypes)}, baselines {', '.join(prob.baselines)}"]
    lines += cpu_checks(prob, shapes)
    for line in lines:
        log.info(line)
    chosen = genomes(prob, sample, seed)
    for dtype in prob.dtypes:
        found, first = compile_all(prob, chosen, dtype, compile_fn)
        lines += found
        if first:
            for line in found:
                log.info(line)
            raise CheckFailed(f"{dtype}: {first}")
    return lines
