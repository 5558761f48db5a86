"""The static half of `kernel-factory check`: what a problem plugin declares, read without running it. Each rule of
docs/adding-a-problem.md has a name (RULES); a broken rule raises CheckFailed with that name and one line that says
what is wrong and how to fix it."""
from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from ..evaluate import render
from ..protocols import (SHAPE_SETS, DeclaresDeterminism, ExpectedSass, Problem, PublishedPeers, RaggedShapes,
                         RowReference)

# Every rule a plugin must follow, by name: the docs state each (docs/adding-a-problem.md), check enforces each, and
# tests/test_plugin_rules.py breaks each on purpose.
RULES = {
    "entry-point": "the entry point gives an object with every member of Problem, named as the entry point",
    "imports": "the plugin imports of the factory only its floor 1 (types, protocols, inputs, compiled, regions, "
               "workload) and kernels/",
    "shape-sets": "benchmark, correctness and heldout are non-empty; shapes are positive ints, all of one rank "
                  "(or, with RaggedShapes, each longer than its fixed dims)",
    "dtypes": "dtypes are torch dtype names; the first is the default",
    "baselines": "baselines name at least one, each once; baseline() of an unknown name raises MissingBaseline",
    "tolerance": "tolerance(dtype) is (atol, rtol) with 0 < atol < 1, 0 < rtol < 0.1 (output_tolerance: 0 <= atol)",
    "gene-names": "gene names and named choices are C identifiers, and no two genes make the same macro",
    "feasible-defaults": "the gene defaults pass the space's rule",
    "kernel-name": "the template defines extern \"C\" __global__ kernels named as kernel_name and each Launch.kernel",
    "inline-headers": "template() inlines its local headers: NVRTC gets no include path",
    "genes-header": "the template includes the genes header that `kernel-factory genes` writes from today's space",
    "handwritten-macros": "the template #defines no gene macro, choice constant or DTYPE by hand",
    "macro-clash": "no gene macro (a gene's name in capitals) is also an identifier the template declares",
    "torch-compile": "a torch.compile baseline goes through compiled_for (plain torch.compile runs eagerly past 8 "
                     "shapes)",
    "seeded-inputs": "make_inputs gives the same tensors for a seed, others for another seed, on the device asked",
    "reference": "reference() returns finite fp32 (or wider) outputs, each with a buffer of its shape in "
                 "make_outputs, in every dtype",
    "row-wise": "output rows depend only on the same input rows (M = shape[0]), unless the problem is a RowReference",
    "launch": "launch() gives Launch steps within CUDA's limits, with tensors and numpy scalars as arguments",
    "bytes-moved": "bytes_moved(case) is a positive int for every shape of every set",
    "special-inputs": "special_inputs() gives make_inputs' tensors (keys, shapes, dtypes), seeded, with a finite "
                      "reference",
    "peers": "peers are among the baselines",
    "row-reference": "reference_rows(inputs, rows) equals reference() at those rows for row_outputs, whole for others",
    "determinism": "deterministic is a bool",
    "expected-sass": "expected_sass() gives (opcode regex, present, why) triples with regexes that compile",
    "recipe": "recipe(genes, dtype) is a valid launch recipe whose steps are launch()'s",
    "workload": "workload is a Workload over the problem's dtypes with no problems",
    "baseline-runs": "each baseline that runs on the CPU matches the reference; the others are named as skipped",
    "compiles": "every sampled genome compiles for sm_90a in every dtype",
}

# What a plugin may import of the factory (the "plugins" import-linter contract, for packages outside the repo).
ALLOWED_IMPORTS = ("kernel_factory.evo.types", "kernel_factory.evo.protocols", "kernel_factory.evo.inputs",
                   "kernel_factory.evo.compiled", "kernel_factory.evo.regions", "kernel_factory.evo.workload",
                   "kernel_factory.kernels")
MEMBERS = ("name", "version", "description", "kernel_name", "space", "dtypes", "shape_sets", "baselines",
           "template", "bytes_moved", "tolerance", "make_inputs", "make_outputs", "reference", "launch", "baseline")
C_KEYWORDS = {"return", "case", "else", "goto", "sizeof", "typedef", "throw", "new", "delete", "co_return"}


class CheckFailed(Exception):
    """The first broken rule: its name and one line; `context` may hold lines that show where (generated source)."""

    def __init__(self, rule: str, message: str, context: str = ""):
        assert rule in RULES, rule
        super().__init__(f"[{rule}] {message}")
        self.rule, self.context = rule, context


def fail(rule: str, message: str, context: str = "") -> None:
    raise CheckFailed(rule, message, context)


def members(prob: Any, entry_name: str) -> None:
    missing = [m for m in MEMBERS if not hasattr(prob, m)]
    if missing or not isinstance(prob, Problem):
        fail("entry-point", f"the entry point gives a {type(prob).__name__}, which lacks {', '.join(missing)} "
                            "(see kernel_factory.evo.protocols.Problem)")
    if prob.name != entry_name:
        fail("entry-point", f"the entry point is named {entry_name!r} but the problem's name is {prob.name!r}: "
                            "configs, recordings and genes headers use the name, so the two must agree")


def factory_imports(module: Any) -> list[str]:
    """What a plugin's module imports of the factory and of no package of its own: each `import` by module name,
    each `from M import a` as M.a (relative imports resolved), outside floor 1 and the kernels."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return []
    package = (module.__package__ or "").split(".")

    def allowed(name: str) -> bool:
        own = ".".join(package)
        return (not name.startswith("kernel_factory.") or name.startswith(ALLOWED_IMPORTS)
                or bool(own) and name.startswith(own + ".") and own != "kernel_factory.evo")
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if not allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            bad += [f"{base}.{a.name}" for a in node.names if not allowed(base) and not allowed(f"{base}.{a.name}")]
    return sorted(set(bad))


def imports(prob: Problem) -> None:
    module = sys.modules.get(type(prob).__module__)
    bad = factory_imports(module) if module is not None else []
    if bad:
        fail("imports", f"{module.__name__} imports {', '.join(bad)}: a plugin imports of the factory only "
                        f"{', '.join(a.rsplit('.', 1)[-1] for a in ALLOWED_IMPORTS)} (the engine may change)")


def shape_sets(prob: Problem) -> None:
    missing = [s for s in SHAPE_SETS if not prob.shape_sets.get(s)]
    if missing:
        fail("shape-sets", f"shape_sets needs non-empty {', '.join(missing)} (valid: {', '.join(SHAPE_SETS)})")
    ranks = set()
    fixed = prob.fixed_dims if isinstance(prob, RaggedShapes) else None
    if fixed is not None and (type(fixed) is not int or fixed < 0):
        fail("shape-sets", f"fixed_dims = {fixed!r}; the count of leading dims every ragged shape has (an int >= 0)")
    for key in SHAPE_SETS:
        for shape in prob.shape_sets[key]:
            if not isinstance(shape, tuple) or not shape or any(type(d) is not int or d < 1 for d in shape):
                fail("shape-sets", f"shape_sets[{key!r}] holds {shape!r}; a shape is a tuple of positive ints")
            if fixed is not None and len(shape) <= fixed:
                fail("shape-sets", f"shape_sets[{key!r}] holds {shape!r}: a ragged shape has its {fixed} fixed dims "
                                   f"and at least one more")
            ranks.add(len(shape))
    if len(ranks) > 1 and fixed is None:
        fail("shape-sets", f"shapes of ranks {sorted(ranks)}: every shape of a problem has one rank (or declare "
                           f"`fixed_dims`, RaggedShapes, for shapes whose trailing dims vary)")


def dtypes(prob: Problem) -> None:
    import torch
    if not prob.dtypes:
        fail("dtypes", "dtypes must name at least one (torch dtype names, e.g. 'bfloat16')")
    bad = [d for d in prob.dtypes if not isinstance(getattr(torch, str(d), None), torch.dtype)]
    if bad:
        fail("dtypes", f"{', '.join(map(repr, bad))} is not a torch dtype name (e.g. bfloat16, float16, float32)")


def baselines(prob: Problem) -> None:
    if not prob.baselines or len(set(prob.baselines)) != len(prob.baselines):
        fail("baselines", f"baselines {tuple(prob.baselines)} must name at least one, each once")


def tolerances(prob: Problem) -> None:
    for dtype in prob.dtypes:
        atol, rtol = prob.tolerance(dtype)
        if not (0 < atol < 1 and 0 < rtol < 0.1):
            fail("tolerance", f"tolerance({dtype!r}) = ({atol}, {rtol}); need 0 < atol < 1, 0 < rtol < 0.1")


def output_tolerances(prob: Problem, names: Any) -> None:
    per_output = getattr(prob, "output_tolerance", None)
    for name in names if per_output is not None else ():
        for dtype in prob.dtypes:
            got = per_output(name, dtype)
            if got is not None and not (0 <= got[0] < 1 and 0 < got[1] < 0.1):
                fail("tolerance", f"output_tolerance({name!r}, {dtype!r}) = {got}; need None or (atol, rtol) "
                                  "with 0 <= atol < 1 (0: relative only), 0 < rtol < 0.1")


def space(prob: Problem) -> None:
    faults = [f for g in prob.space.genes for f in g.naming_faults()] + prob.space.macro_clashes()
    if faults:
        fail("gene-names", faults[0])
    why = prob.space.why_infeasible(prob.space.defaults())
    if why:
        fail("feasible-defaults", f"the gene defaults are infeasible: {why}; the template's defaults must be a "
                                  "genome the space's rule accepts")


def kernel_defined(text: str, name: str) -> bool:
    return re.search(r'extern\s+"C"\s+__global__[^;{}]*?\b' + re.escape(name) + r"\s*\(", text) is not None


def code_lines(text: str) -> str:
    """The template without comments and preprocessor lines: the C++ that declares names."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def template(prob: Problem) -> str:
    """The template's rules that need no compiler; returns its text."""
    text = prob.template()
    local = re.findall(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', text, re.M)
    header = render.header_name(prob)
    if local:
        fail("inline-headers", f"template() returns #include \"{local[0]}\": NVRTC gets no include path, so "
                               "template() must replace each local #include with the header's text"
                               + (" (its genes header too)" if local[0] == header else ""))
    fault = render.genes_header_fault(prob, text)
    if fault:
        fail("genes-header", fault)
    if not kernel_defined(text, prob.kernel_name):
        fail("kernel-name", f"the template has no extern \"C\" __global__ kernel named {prob.kernel_name!r} "
                            "(kernel_name); without extern \"C\" NVRTC mangles the name")
    from .genes import handwritten
    by_hand = handwritten(prob, render.genes_header(prob))
    if by_hand:
        fail("handwritten-macros", f"the template #defines {', '.join(by_hand)} by hand; the gene space owns them "
                                   f"(its genes header {header} defines them)")
    code = code_lines(text.replace(render.genes_header(prob), ""))
    for gene in prob.space.genes:
        macro = gene.name.upper()
        for found in re.finditer(r"\b([A-Za-z_]\w*)[ \t]+" + macro + r"\s*[,;)=\[]", code):
            if found.group(1) not in C_KEYWORDS:
                line = code[code.rfind("\n", 0, found.start()) + 1:].split("\n", 1)[0].strip()
                fail("macro-clash", f"gene {gene.name!r} becomes the macro {macro}, and the template declares the "
                                    f"name {macro} in `{line[:100]}`: the macro replaces it (NVRTC then says "
                                    "'expected an identifier'); rename the gene or the identifier")
    return text


def compile_baselines(prob: Problem) -> None:
    """A plain torch.compile in the plugin's module is a baseline that turns eager without a word past dynamo's
    recompile limit (8 shapes); compiled_for compiles per case and proves each call ran compiled."""
    module = sys.modules.get(type(prob).__module__)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError, SyntaxError):
        return
    for node in ast.walk(tree) if tree is not None else ():
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr == "compile" and "torch" in ast.unparse(func.value):
            fail("torch-compile", f"{module.__name__} calls torch.compile directly (line {node.lineno}): past "
                                  "dynamo's recompile limit (8 shapes) it runs eagerly and its times are eager's; "
                                  "use kernel_factory.evo.compiled.compiled_for(fn, case key)")


def offers(prob: Problem, member: str) -> bool:
    """Whether the problem offers an optional hook: it has the member and the member is not None (a subclass turns
    an inherited hook off with None)."""
    return getattr(prob, member, None) is not None


def hooks(prob: Problem) -> list[str]:
    """The optional capabilities the problem offers, checked for their static shape; returns their names."""
    offered = [m for m in ("peers", "deterministic", "row_outputs", "special_inputs", "output_tolerance",
                           "expected_sass", "recipe", "workload") if offers(prob, m)]
    if isinstance(prob, PublishedPeers) and offers(prob, "peers"):
        stray = [p for p in prob.peers if p not in prob.baselines]
        if stray:
            fail("peers", f"peers {stray} are not baselines ({', '.join(prob.baselines)})")
    if isinstance(prob, DeclaresDeterminism) and not isinstance(prob.deterministic, bool):
        fail("determinism", f"deterministic is {prob.deterministic!r}; it must be True or False")
    if isinstance(prob, RowReference) and not callable(getattr(prob, "reference_rows", None)):
        fail("row-reference", "row_outputs is declared but reference_rows(inputs, rows) is not")
    if isinstance(prob, ExpectedSass) and offers(prob, "expected_sass"):
        for dtype in prob.dtypes:
            for item in prob.expected_sass(prob.space.defaults(), dtype):
                try:
                    pattern, present, why = item
                    re.compile(pattern)
                    ok = isinstance(present, bool) and isinstance(why, str)
                except (TypeError, ValueError, re.error):
                    ok = False
                if not ok:
                    fail("expected-sass", f"expected_sass(defaults, {dtype!r}) holds {item!r}; each item is "
                                          "(opcode regex, must be present: bool, why: str)")
    if offers(prob, "workload"):
        from ..workload import Workload
        work = prob.workload   # type: ignore[attr-defined]
        faults = work.problems() if isinstance(work, Workload) else [f"it is a {type(work).__name__}"]
        stray = [d for d in getattr(work, "dtypes", ()) if d not in prob.dtypes]
        if faults or stray:
            fail("workload", f"workload: {(faults or [f'dtypes {stray} are not the problem dtypes'])[0]} (a "
                             "kernel_factory.evo.workload.Workload over the problem's dtypes)")
    return [{"row_outputs": "reference_rows"}.get(m, m) for m in offered]


def static(prob: Problem, entry_name: str) -> list[str]:
    """Every rule that needs no tensors and no compiler; the report's first line."""
    members(prob, entry_name)
    imports(prob)
    shape_sets(prob)
    dtypes(prob)
    baselines(prob)
    tolerances(prob)
    space(prob)
    template(prob)
    compile_baselines(prob)
    offered = hooks(prob)
    return [f"contract: {prob.name} v{prob.version}, {len(prob.space.genes)} genes ({prob.space.size()} genomes "
            f"before the rule), dtypes {'/'.join(prob.dtypes)}, baselines {', '.join(prob.baselines)}; optional "
            f"hooks: {', '.join(offered) or 'none'}"]


def module_folder(prob: Problem) -> Path | None:
    module = sys.modules.get(type(prob).__module__)
    return Path(module.__file__).resolve().parent if getattr(module, "__file__", None) else None
