"""Render a candidate into CUDA source: a header naming it, one #define per gene, and the template with any code
patch applied to its marked editable regions. Also writes the text of a template's generated genes header (the
gene macros' enumerations and defaults, so that they have one home: the problem's gene space)."""
from __future__ import annotations

from typing import Any, Mapping

from ..protocols import Problem
from ..regions import PatchError, apply_patch
from ..types import Candidate, Genome

# The element type's macro: the body says `#define DTYPE DTYPE_<DTYPE>`; every template's genes header defines all of
# these, so that `#if DTYPE == DTYPE_FLOAT16` never compares against an undefined name (which the preprocessor reads
# as 0, the code of bfloat16). A problem dtype beyond them gets the next code.
DTYPE_CODES = {"bfloat16": 0, "float16": 1, "float32": 2}


def body(problem: Problem, genome: Genome, dtype: str) -> str:
    """Everything that determines the binary: gene #defines, the dtype and the patched template."""
    lines = [f"#define {gene.name.upper()} {gene.define(genome.gene_dict[gene.name])}" for gene in problem.space.genes]
    lines.append(f"#define DTYPE {dtype_macro(dtype)}")
    return "\n".join(lines) + "\n" + apply_patch(problem.template(), genome.patch_dict)


def dtype_macro(dtype: str) -> str:
    return f"DTYPE_{dtype.upper()}"


def genes_header(problem: Problem) -> str:
    """The text of `<problem>_genes.cuh`, which the problem's template includes: DTYPE's codes and one macro per
    gene at its default (#ifndef: a rendered candidate's own #defines, which come first, win), with the enumeration
    constants NAME_CHOICE of every gene with named choices (their code is the choice's position in the space)."""
    dtypes = {**DTYPE_CODES, **{d: len(DTYPE_CODES) + i for i, d in enumerate(
        d for d in problem.dtypes if d not in DTYPE_CODES)}}
    default = problem.dtypes[0]
    lines = [f"// Generated from the gene space of problem {problem.name} by `kernel-factory genes`: do not edit",
             "// (change the gene space, then run the command again; a CPU test fails while this file is stale).",
             "//",
             "// A rendered candidate starts with `#define DTYPE DTYPE_<ITS DTYPE>` and one #define per gene, so the",
             "// #ifndef defaults below serve only the template compiled as-is. Macros a template may rely on:",
             "// - DTYPE: the candidate's element type, one of the DTYPE_* codes below, all of them defined whatever",
             f"//   the problem's dtypes ({', '.join(problem.dtypes)}). Choose with `#if DTYPE == DTYPE_FLOAT16`.",
             "// - one macro per gene, its name in capitals: an int as-is, a boolean as 0 or 1, a named choice as the",
             "//   constant GENE_CHOICE (compare e.g. `#if LOAD == LOAD_NC`, never with a number).",
             *(f"#define {dtype_macro(d)} {code}" for d, code in dtypes.items()),
             f"#ifndef DTYPE\n#define DTYPE {dtype_macro(default)}\n#endif"]
    for gene in problem.space.genes:
        named = [c for c in gene.choices if isinstance(c, str)]
        choices = "" if named else ": " + " | ".join(gene.define(c) for c in gene.choices)
        lines.append(f"// {gene.name} ({gene.kind}){choices}")
        lines += [f"#define {gene.define(c)} {i}" for i, c in enumerate(gene.choices) if isinstance(c, str)]
        lines.append(f"#ifndef {gene.name.upper()}\n#define {gene.name.upper()} {gene.define(gene.default)}\n#endif")
    return "\n".join(lines) + "\n"


def header_name(problem: Problem) -> str:
    return f"{problem.name}_genes.cuh"


def genes_header_fault(problem: Problem, text: str | None = None) -> str:
    """"" when the problem's template, as template() returns it (or `text`), holds the genes header that its gene space
    writes today; else one line saying what is wrong and that `kernel-factory genes` fixes it. A stale header is a
    silent mistake: a choice added since it was written renders as an undefined macro, which the preprocessor reads
    as 0, so the candidate compiles as the gene's first choice."""
    text = problem.template() if text is None else text
    want = genes_header(problem)
    if want in text:
        return ""
    name = header_name(problem)
    fix = (f"run `kernel-factory genes {problem.name}` (and reinstall the plugin unless it is installed in editable "
           f"mode)")
    if want.splitlines()[0] in text:
        return f"the genes header {name} in the template is stale (the gene space changed since it was written): {fix}"
    if f'#include "{name}"' in text:
        return (f"template() returns the line #include \"{name}\" instead of the header's text: NVRTC gets no "
                f"include path, so template() must inline it (docs/adding-a-problem.md, template rules)")
    return (f"the template does not include its genes header {name}: add the line #include \"{name}\" (inlined by "
            f"template()) and {fix}")


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
