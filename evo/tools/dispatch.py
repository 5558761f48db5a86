"""The dispatch table that `kernel-factory export` writes and the library op reads (kernels/ops/<problem>.json; the
op's reader is kernels/table.py): per dtype, the genome to run at each row width N that a run measured, a general
genome for every other N, where each number came from, and, with --build, everything the op needs to run each
(genome, dtype) without the factory: its sm_90a cubin (kernels/ops/cubins/), its launch recipe (kernels/recipe.py)
and its compressed source (kernels/ops/sources/, for a JIT build on another architecture).

The key is exact (dtype, N) and M is ignored. That is safe for row-wise kernels: each row is normalized on its own
(a backward also sums dw over rows, but its grid, not its correctness, depends on M), every genome passed the
problem's correctness gate at many M including M = 1 and ragged M, and M only sets how many rows the grid covers.
The genome fastest at a large M is the one that best fills the GPU with rows of that width; at small M every genome
is bound by launch latency and the choice matters little.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import ConfigError
from ..evaluate import render
from ...kernels import dispatch_rule
from ...kernels import recipe as op_recipe
from ...kernels import table as op_table
from ..evaluate.compile import ARCH, CompileJob, compile_one, nvrtc_version
from ..protocols import LaunchRecipe, Problem
from ..types import Candidate, Genome

FORMAT = op_table.FORMAT
OLD_FORMAT = op_table.SELECTION_ONLY   # before launch recipes: the same selection, kernels not yet built
CUBIN_FOLDER = "cubins"
SOURCE_FOLDER = "sources"
DISPATCH_KEY = ("exact (dtype, N), else the dtype's general genome. M is ignored: the kernels work row by row, "
                "every genome passed the problem's correctness gate at many M (M = 1 and ragged M included), and M "
                "only sets how many rows the grid covers; each N's genome was chosen at the largest M measured for "
                "it, where the choice matters most.")


class TableError(ConfigError):
    """A dispatch table that cannot be read or used; the message names the file and what is wrong."""


def load(path: str | Path) -> dict[str, Any]:
    """A dispatch table from disk, checked for its format and its genome references."""
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except OSError as exc:
        raise TableError(f"cannot read dispatch table {str(path)!r}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise TableError(f"dispatch table {str(path)!r} is not JSON: {exc}") from exc
    if not isinstance(table, dict) or table.get("format") not in (FORMAT, OLD_FORMAT):
        raise TableError(f"{str(path)!r} is not a dispatch table (expected format {FORMAT!r}); "
                         f"write one with `kernel-factory export`")
    known = set(table.get("genomes", {}))
    for dtype, entry in table.get("dtypes", {}).items():
        used = op_table.chosen_genomes(entry)
        missing = sorted(set(used) - known)
        if missing:
            raise TableError(f"dispatch table {str(path)!r}: {dtype} names genomes {missing} it does not define")
    return table


def genome(table: Mapping[str, Any], genome_id: str) -> Genome:
    return Genome.from_json(table["genomes"][genome_id])


def lookup(table: Mapping[str, Any], dtype: str, n: int, m: int = 1) -> tuple[Genome, str] | None:
    """The genome for M rows of width n in dtype and why it was chosen ("rule leaf 3", "N=4096" or "general");
    None when the table has nothing for this dtype. The op's reader decides; this only adds the genome record."""
    found = op_table.choose_in(table, dtype, n, m)
    return None if found is None else (genome(table, found[0]), found[1])


def cubin_name(problem_name: str, genome_id: str, dtype: str) -> str:
    return f"{problem_name}-{genome_id}-{dtype}.cubin"


def body_sha256(problem: Problem, genome: Genome, dtype: str) -> str:
    """Hash of the rendered source that determines the binary (genes, dtype, patched template): a prebuilt cubin is
    used only while the template still renders to the same source."""
    return hashlib.sha256(render.body(problem, genome, dtype).encode()).hexdigest()


def source(problem: Problem, genome: Genome, dtype: str) -> str:
    """The CUDA source an op compiles for this genome (a header naming it, then the body)."""
    return render.render(problem, Candidate(genome, operator="export"), dtype)


def compile_cubin(problem: Problem, genome: Genome, dtype: str) -> bytes:
    """An sm_90a cubin for one genome and dtype, compiled in this process with NVRTC (no GPU needed)."""
    out = compile_one(CompileJob(genome.id, source(problem, genome, dtype), f"{problem.name}-{genome.id}-{dtype}.cu"))
    if out.cubin is None:
        raise TableError(f"genome {genome.id} ({dtype}) of {problem.name} does not compile: {out.error}"[:4000])
    return out.cubin


def used(table: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (genome id, dtype) pair the table can dispatch to, sorted."""
    return sorted({(gid, dtype) for dtype, entry in table.get("dtypes", {}).items()
                   for gid in op_table.chosen_genomes(entry)})


def build(problem: Problem, table: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """Compile every genome the table dispatches to into folder/<problem>-<genome>-<dtype>.cubin, write its source
    beside (folder/../sources/, gzip), and record in table["kernels"] what the op needs: the cubin's file and sha256,
    the launch recipe, the source file and the toolchain. Deletes this problem's cubins and sources that the table no
    longer names. Returns the table."""
    if not isinstance(problem, LaunchRecipe) or problem.recipe is None:
        raise TableError(f"problem {problem.name!r} has no recipe(genes, dtype): the op cannot launch its kernels "
                         f"without the plugin; give it a launch recipe (docs/adding-a-problem.md, the launch recipe) "
                         f"to export it")
    for genome_id, dtype in used(table):
        wrong = op_recipe.check(problem.recipe(_in_space(problem, genome(table, genome_id)).gene_dict, dtype))
        if wrong:
            raise TableError(f"the launch recipe of {problem.name} genome {genome_id} ({dtype}) cannot be exported: "
                             f"{wrong[0]}")
    folder = Path(folder)
    sources = folder.parent / SOURCE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    sources.mkdir(parents=True, exist_ok=True)
    toolchain = nvrtc_version()
    records = {}
    for genome_id, dtype in used(table):
        g = _in_space(problem, genome(table, genome_id))
        cubin = compile_cubin(problem, g, dtype)
        name = cubin_name(problem.name, genome_id, dtype)
        (folder / name).write_bytes(cubin)
        stem = name[:-len(".cubin")]
        # the header names the genome by the table's id (a genome from before a gene was added keeps its own)
        text = source(problem, g, dtype).replace(f"candidate {g.id} ", f"candidate {genome_id} ", 1)
        (sources / f"{stem}.cu.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
        records[f"{genome_id}:{dtype}"] = {
            "cubin": f"{folder.name}/{name}", "sha256": hashlib.sha256(cubin).hexdigest(),
            "source": f"{sources.name}/{stem}.cu.gz", "body_sha256": body_sha256(problem, g, dtype),
            "arch": ARCH, "nvrtc": toolchain, "recipe": problem.recipe(g.gene_dict, dtype)}
    keep = {Path(r["cubin"]).name for r in records.values()} | {Path(r["source"]).name for r in records.values()}
    for stale in [*folder.glob(f"{problem.name}-*.cubin"), *sources.glob(f"{problem.name}-*.cu.gz")]:
        if stale.name not in keep:
            stale.unlink()
    table.pop("cubins", None)
    table["format"] = FORMAT
    table["kernels"] = records
    return table


def _in_space(problem: Problem, g: Genome) -> Genome:
    """The genome with every gene of today's space, a gene added since the table was written at its default (which
    renders the kernel it was measured as); the table keeps the id it was written with."""
    missing = {n: v for n, v in problem.space.defaults().items() if n not in g.gene_dict}
    return Genome.of({**g.gene_dict, **missing}, g.patch_dict) if missing else g


def dumps(table: Mapping[str, Any]) -> str:
    """Stable text (sorted keys, one level of indent), so that a re-export of the same runs gives the same file."""
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def parse_region(text: str | None) -> dict[str, Any] | None:
    """`FEATURE<=VALUE` or `FEATURE>=VALUE` (widen's --where) as a region, None for None; TableError naming what
    would be valid."""
    if text is None:
        return None
    op = "<=" if "<=" in text else ">="
    feature, sep, value = text.partition(op)
    try:
        bound = float(value)
    except ValueError:
        bound = None
    if not sep or feature.strip() not in dispatch_rule.FEATURES or bound is None:
        raise TableError(f"--where {text!r}: give FEATURE<=VALUE or FEATURE>=VALUE, FEATURE one of "
                         f"{', '.join(dispatch_rule.FEATURES)} (e.g. log2_n<=8: rows of at most 256 elements)")
    return {"feature": feature.strip(), "le" if op == "<=" else "ge": bound}


def widen(table: dict[str, Any], panels: Mapping[str, bytes | Path],
          where: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Adds to each dtype's entry, as candidates for first-call tuning (kernels/tune.py), the genomes fastest on
    some shape of its campaign panel (panel-<dtype>.jsonl) that the table does not run yet, with their genes; the
    rule is unchanged. With a region (`{"feature": "log2_n", "le": 8.0}`), each is timed only on calls inside it:
    a study of narrow rows says nothing of wide ones, and its kernels there would only lengthen a first call.
    Returns how many were added per dtype (build() then compiles them)."""
    from . import learn
    from .workload_panels import read_panel
    wrong = op_table.region_problems(where, "widen --where") if where is not None else []
    if wrong:
        raise TableError(wrong[0])
    added = {}
    for dtype, panel in sorted(panels.items()):
        entry = table.get("dtypes", {}).get(dtype)
        if entry is None:
            continue
        genomes, times = read_panel(panel)
        have = set(op_table.chosen_genomes(entry))
        extra = [g for g in learn.winners(times) if g not in have]
        entry["candidates"] = [*entry.get("candidates", []),
                               *(extra if where is None else [{"genome": g, "where": dict(where)} for g in extra])]
        for gid in extra:
            table["genomes"][gid] = genomes[gid].to_json()
        added[dtype] = len(extra)
    return added


def twin(table: dict[str, Any], problem: Problem, changes: Mapping[str, Any], keep: bool = False) -> dict[str, str]:
    """Replaces every genome the table runs by its twin with `changes` to its genes (e.g. tail=peel: a technique that
    leaves the kernel's other paths as they were), wherever the twin is feasible; the rule, exact widths, general
    genome and tuning candidates then name the twins, and the rule's recorded costs stay those measured for the
    originals. A genome whose twin is infeasible stays. With `keep`, each replaced genome stays too, as a tuning
    candidate of every dtype that ran it (kernels/tune.py times both on a shape's first call: a twin that is slower on
    some shape then costs nothing there but the first call's timing). Returns {original id: twin id} (build() then
    compiles)."""
    wrong = [f"{k}={v!r}" for k, v in changes.items()
             if k not in problem.space.names or v not in problem.space[k].choices]
    if wrong:
        raise TableError(f"twin: {', '.join(wrong)} is not a gene value of {problem.name}; its genes: "
                         + "; ".join(f"{g.name} in {list(g.choices)}" for g in problem.space.genes))
    renamed: dict[str, str] = {}
    for gid in sorted({g for _, entry in table.get("dtypes", {}).items() for g in op_table.chosen_genomes(entry)}):
        original = _in_space(problem, genome(table, gid))
        twin_genes = {**original.gene_dict, **changes}
        if twin_genes == original.gene_dict or problem.space.why_infeasible(twin_genes):
            continue
        twinned = Genome.of(twin_genes, original.patch_dict)
        renamed[gid] = twinned.id
        table["genomes"][twinned.id] = twinned.to_json()
    for dtype, entry in table.get("dtypes", {}).items():
        ran = [g for g in dict.fromkeys(op_table.chosen_genomes(entry)) if g in renamed]
        text = json.dumps(entry)
        for old, new in renamed.items():   # ids are 16 hex digits: no id is a part of another's text
            text = text.replace(f'"{old}"', f'"{new}"')
        table["dtypes"][dtype] = json.loads(text)
        if keep:
            table["dtypes"][dtype].setdefault("candidates", []).extend(ran)
    if not keep:
        for gid in renamed:
            del table["genomes"][gid]
    table.setdefault("twinned", []).append({"changes": dict(changes), "genomes": len(renamed),
                                            **({"kept": True} if keep else {})})
    return renamed


def graft(table: Mapping[str, Any], graft_file: Mapping[str, Any], dtypes: Sequence[str] | None = None,
          where: str = "graft") -> dict[str, Any]:
    """A copy of the table in which, for each dtype of the graft (or of `dtypes`), the rule first asks whether a
    call lies in the graft's region (`{"feature": "log2_m", "le": 6.0}`: M <= 64); there the grafted rule decides,
    elsewhere the table's own rule, unchanged. The graft file holds the region, a rule per dtype
    (`{"rules": {dtype: {"tree": node}}}`), the genes of every genome its rules name (`"genomes"`) and where it was
    learned (`"source"`). A rule learned for a region of shapes (few rows, say) thus joins a table learned from all
    of them without re-learning the rest. Grafted leaves are numbered after the table's own, so that the op's
    "rule leaf N" stays unique. Build the kernels of the result before the op runs it."""
    region = graft_file.get("region")
    if not isinstance(region, Mapping) or region.get("feature") not in dispatch_rule.FEATURES \
            or not isinstance(region.get("le"), (int, float)):
        raise TableError(f"{where}: 'region' must be {{'feature': one of {', '.join(dispatch_rule.FEATURES)}, "
                         f"'le': a number}}, got {region!r}")
    rules, genes = graft_file.get("rules") or {}, graft_file.get("genomes") or {}
    wanted = list(dtypes) if dtypes else sorted(rules)
    out = json.loads(json.dumps(table))   # a deep copy: the caller's table stays as it was
    for dtype in wanted:
        entry = out.get("dtypes", {}).get(dtype)
        if dtype not in rules:
            raise TableError(f"{where}: no rule for {dtype}; it has rules for {', '.join(sorted(rules)) or 'none'}")
        if entry is None or "rule" not in entry:
            raise TableError(f"{where}: the table has no learned rule for {dtype} to graft onto (a table of exact "
                             f"widths answers by N first); learn one with a workload campaign")
        tree = json.loads(json.dumps(rules[dtype].get("tree")))
        wrong = dispatch_rule.check(tree, f"{where}.rules.{dtype}.tree")
        if wrong:
            raise TableError("; ".join(wrong))
        for gid in dispatch_rule.leaves(tree):
            if gid not in out["genomes"]:
                if gid not in genes:
                    raise TableError(f"{where}: the {dtype} rule names genome {gid}, whose genes it does not give")
                g = Genome.of(genes[gid])
                if g.id != gid:
                    raise TableError(f"{where}: the genes given for genome {gid} are those of genome {g.id}")
                out["genomes"][gid] = g.to_json()
        _renumber(tree, 1 + max(_ids(entry["rule"]), default=0))
        entry["rule"] = {"feature": region["feature"], "le": region["le"], "then": tree, "else": entry["rule"]}
        entry.setdefault("grafted", []).append({"region": dict(region), "source": graft_file.get("source", where)})
    return out


def _ids(node: Mapping[str, Any]) -> list[int]:
    own = [int(node["id"])] if "id" in node else []
    return own + [i for b in ("then", "else") if b in node for i in _ids(node[b])]


def _renumber(node: dict[str, Any], start: int) -> int:
    """Number the leaves (and nearest-shapes nodes) of a tree from start, in leaf order; the next free number."""
    if "leaf" in node or "near" in node:
        node["id"] = start
        return start + 1
    return _renumber(node["else"], _renumber(node["then"], start))
