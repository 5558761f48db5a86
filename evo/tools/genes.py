"""`kernel-factory genes`: write (or, with --check, verify) each problem's generated genes header, so that a gene's
choices and default live once, in the problem's gene space, and never again by hand in its CUDA template.

A template opts in with the line `#include "<problem>_genes.cuh"`; the header is written beside the file that
includes it: the factory's template folder (kernels/) or the folder of the problem's own module (a plugin package
installed in editable mode; for one installed as a copy, name its source folder with --dir).
"""
from __future__ import annotations

import inspect
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..evaluate import render
from ..protocols import Problem
from ...kernels import templates


@dataclass(frozen=True)
class HeaderState:
    """One problem's generated header: where it goes (None: no template includes it), the text it must hold,
    whether the file holds it, and the gene macros its template still #defines by hand."""

    problem: str
    path: Path | None
    text: str
    fresh: bool
    handwritten: tuple[str, ...]

    def fault(self) -> str:
        """What is wrong, in one line, or "" if nothing."""
        if self.path is None:
            return (f"no template in kernels/ or in an editable source folder includes \"{self.problem}_genes.cuh\" "
                    "(for a plugin installed as a copy, pass its source folder with --dir)")
        if not self.fresh:
            return f"{self.path} is {'stale' if self.path.is_file() else 'missing'}: run `kernel-factory genes`"
        if self.handwritten:
            return (f"the template #defines {', '.join(self.handwritten)} by hand; the gene space owns them "
                    f"(see {self.path.name})")
        return ""


def header_name(problem: Problem) -> str:
    return f"{problem.name}_genes.cuh"


def header_path(problem: Problem, folder: Path | None = None) -> Path | None:
    """Where the problem's genes header belongs: beside the .cu/.cuh file that includes it (in `folder`, else in
    kernels/ or the problem module's folder), or None if none does."""
    include = f'#include "{header_name(problem)}"'
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    module_folder = Path(inspect.getfile(type(problem))).resolve().parent
    # A plugin installed as a copy is skipped: its source folder, where the header belongs, is elsewhere (--dir).
    places = (folder,) if folder else (templates.HERE, *(() if module_folder.is_relative_to(installed) else
                                                         (module_folder,)))
    for place in places:
        for source in sorted(place.glob("*.cu")) + sorted(place.glob("*.cuh")):
            if include in source.read_text():
                return place / header_name(problem)
    return None


def handwritten(problem: Problem, generated: str) -> list[str]:
    """Macros of the gene space (DTYPE, the genes and their GENE_CHOICE constants) that the problem's template
    #defines outside its generated header: each is a second home of something the gene space owns."""
    text = problem.template()
    if generated in text:
        text = text.replace(generated, "", 1)
    names = ["DTYPE", *(render.dtype_macro(d) for d in (*render.DTYPE_CODES, *problem.dtypes))]
    for gene in problem.space.genes:
        names += [gene.name.upper(), *(gene.define(c) for c in gene.choices if isinstance(c, str))]
    found = re.findall(r"^[ \t]*#[ \t]*define[ \t]+(" + "|".join(map(re.escape, names)) + r")\b", text, re.M)
    return sorted(set(found))


def state(problem: Problem, folder: Path | None = None) -> HeaderState:
    """What `genes --check` reports for one problem (its template's folder looked for in `folder` if given)."""
    text, path = render.genes_header(problem), header_path(problem, folder)
    fresh = path is not None and path.is_file() and path.read_text() == text
    return HeaderState(problem.name, path, text, fresh, tuple(handwritten(problem, text)) if fresh else ())


def main(problems: list[Problem], check: bool, folder: Path | None = None) -> int:
    """Write every stale header (with check, only report it); 1 when something is still wrong, else 0."""
    status = 0
    for problem in problems:
        st = state(problem, folder)
        if st.path is not None and not st.fresh and not check:
            st.path.write_text(st.text)
            print(f"{st.problem}: wrote {st.path}")
            st = state(problem, folder)
        if st.path is None:
            print(f"{st.problem}: skipped, {st.fault()}")
        elif st.fault():
            print(f"{st.problem}: {st.fault()}")
            status = 1
        elif check:
            print(f"{st.problem}: {st.path} is up to date")
    return status
