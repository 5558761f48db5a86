"""Render a candidate into CUDA source: a header naming it, one #define per gene, and the template with any code
patch applied to its marked editable regions."""
from __future__ import annotations

from typing import Any, Mapping

from ..protocols import Problem
from ..regions import PatchError, apply_patch
from ..types import Candidate, Genome


def body(problem: Problem, genome: Genome, dtype: str) -> str:
    """Everything that determines the binary: gene #defines, the dtype and the patched template."""
    lines = [f"#define {gene.name.upper()} {gene.define(genome.gene_dict[gene.name])}" for gene in problem.space.genes]
    lines.append(f"#define DTYPE DTYPE_{dtype.upper()}")
    return "\n".join(lines) + "\n" + apply_patch(problem.template(), genome.patch_dict)


def header(problem: Problem, candidate: Candidate, dtype: str) -> str:
    parents = ", ".join(candidate.parents) or "none"
    return (f"// kernel-factory candidate {candidate.id} | problem {problem.name} v{problem.version} | dtype {dtype}\n"
            f"// parents: {parents} | operator: {candidate.operator} | generation: {candidate.generation}\n")


def render(problem: Problem, candidate: Candidate, dtype: str) -> str:
    return header(problem, candidate, dtype) + body(problem, candidate.genome, dtype)


def adapt(genes: Mapping[str, Any], patch: Mapping[str, str], problem: Problem) -> tuple[Genome | None, tuple, str]:
    """The genome in the problem's current space (missing genes at their defaults), or None and why not."""
    space = problem.space
    unknown = sorted(set(genes) - set(space.names))
    if unknown:
        return None, (), f"genes {unknown} are no longer in the space"
    filled = tuple(n for n in space.names if n not in genes)
    full = {**{n: space[n].default for n in filled}, **genes}
    why = space.why_infeasible(full)
    if why:
        return None, (), f"infeasible now: {why}"
    if patch:
        try:
            apply_patch(problem.template(), dict(patch))
        except PatchError as exc:
            return None, (), str(exc)
    return Genome.of(full, patch), filled, ""
