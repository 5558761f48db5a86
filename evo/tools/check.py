"""`kernel-factory check PROBLEM`: what a plugin author can learn without a GPU. It checks every rule of
docs/adding-a-problem.md: the plugin's contract as declared (check_contract), then on the CPU its inputs, every
dtype's reference, its adversarial inputs, its launch plans at every shape and its baselines (check_cpu), then
renders and NVRTC-compiles a sample of its genomes (or all of them) for the target arch with progress lines
(check_compile), reporting ptxas resources, the gene values that never compile and genomes that compile alike.
It stops at the first broken rule, with one line that names the rule and what is wrong."""
from __future__ import annotations

import logging
from typing import Any, Callable

from .. import registry
from ..evaluate.compile import CompileJob, compile_one
from ..protocols import Problem
from . import check_contract, check_cpu
from .check_compile import compile_all, default_workers, genomes
from .check_contract import RULES, CheckFailed

log = logging.getLogger("kernel_factory.check")
__all__ = ["CheckFailed", "RULES", "check", "genomes", "compile_all"]


def load(name: str) -> Problem:
    """The problem an entry point names (a PluginError, exit 2, when none does or it fails to load)."""
    return registry.load("problem", name)


def check(problem: str | Problem, sample: int | None = 16, seed: int = 0, shapes: int = 3,
          compile_fn: Callable[[CompileJob], Any] = compile_one, emit: Callable[[str], None] = log.info,
          workers: int | None = None) -> list[str]:
    """The report's lines, each passed to `emit` once as soon as it is known (the CLI prints them); CheckFailed at
    the first broken rule, after the lines found before it. `problem` is an entry-point name or a Problem object
    (a plugin not installed yet, as a test of `kernel-factory new` checks it)."""
    prob = load(problem) if isinstance(problem, str) else problem
    entry = problem if isinstance(problem, str) else prob.name
    lines: list[str] = []

    def say(line: str) -> None:
        if line:
            lines.append(line)
            emit(line)
    for line in check_contract.static(prob, entry):
        say(line)
    template = prob.template()
    check_cpu.cpu_checks(prob, shapes, template, say)
    chosen = genomes(prob, sample, seed)
    say(check_cpu.launch_limits(prob, check_cpu.some(chosen, seed), template))
    say(check_cpu.baselines(prob))
    compile_all(prob, chosen, prob.dtypes, compile_fn, workers or default_workers(), say)
    return lines
