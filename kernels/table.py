"""The dispatch table as the library op reads it (kernels/ops/<problem>.json, written by `kernel-factory export`).

Per dtype: a learned rule (a decision tree over the call's M and N, kernels/dispatch_rule.py) when the table was
learned from a workload, else the genome to run at each row width N that a run measured; and a general genome. Per
(genome, dtype) a kernel entry: the sm_90a cubin file and its sha256, the kernel names, the launch recipe
(kernels/recipe.py) and the compressed CUDA source (for a JIT build on another architecture). Everything the op
needs is in the table and the files beside it; nothing here imports the factory. Needs only the standard library.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import dispatch_rule

FORMAT = "kernel-factory-dispatch/2"


class TableError(ValueError):
    """A dispatch table that cannot be read or used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Kernel:
    """One exported (genome, dtype): what the op loads and how it launches it."""

    genome: str
    dtype: str
    why: str                      # why the dispatch chose it ("N=4096", "general")
    cubin_path: Path
    cubin_sha256: str
    arch: str
    recipe: Mapping[str, Any]
    source_path: Path | None

    def cubin(self) -> bytes:
        """The cubin's bytes, checked against the table's sha256."""
        try:
            data = self.cubin_path.read_bytes()
        except OSError as exc:
            raise TableError(f"cannot read cubin {self.cubin_path}: {exc.strerror or exc}") from exc
        if hashlib.sha256(data).hexdigest() != self.cubin_sha256:
            raise TableError(f"cubin {self.cubin_path} does not match its sha256 in the table; re-export")
        return data

    def source(self) -> str | None:
        """The CUDA source the cubin was built from (for a build on another architecture), if shipped."""
        if self.source_path is None or not self.source_path.is_file():
            return None
        return gzip.decompress(self.source_path.read_bytes()).decode()


ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def chosen_genomes(entry: Mapping[str, Any]) -> list[str]:
    """Every genome id one dtype's entry can run: the rule's leaves, the exact widths', the general, and the
    candidates that only first-call tuning times (kernels/tune.py: a campaign's panel winners the rule does not
    name)."""
    rule = dispatch_rule.leaves(entry["rule"]) if "rule" in entry else []
    return [*rule, *(e["genome"] for e in entry.get("by_n", {}).values()), entry["general"]["genome"],
            *(candidate_id(c) for c in entry.get("candidates", []))]


def candidate_id(candidate: str | Mapping[str, Any]) -> str:
    """A tuning candidate's genome id: a candidate is the id itself, or {"genome": id, "where": region} for one
    timed only on calls inside the region (a study's winners for the shapes it measured, e.g. narrow rows)."""
    return candidate if isinstance(candidate, str) else candidate["genome"]


def in_region(region: Mapping[str, Any] | None, dtype: str, m: int, n: int) -> bool:
    """Whether a call of M rows of width n lies in a region {"feature": one of dispatch_rule.FEATURES, "le": value}
    or {"feature": ..., "ge": value} (None: everywhere)."""
    if region is None:
        return True
    value = dispatch_rule.features(m, n, ELEM_BYTES[dtype])[region["feature"]]
    return value <= region["le"] if "le" in region else value >= region["ge"]


def candidate_problems(candidate: Any, where: str) -> list[str]:
    """What is wrong with one tuning candidate of a table, naming `where`: an id, or {"genome": id, "where": region}."""
    if isinstance(candidate, str):
        return []
    if not isinstance(candidate, Mapping) or not isinstance(candidate.get("genome"), str):
        return [f"{where}: a candidate is a genome id or {{'genome': id, 'where': region}}, got {candidate!r}"]
    return region_problems(candidate.get("where"), f"{where}.where")


def region_problems(region: Any, where: str) -> list[str]:
    """What is wrong with a region, each problem naming `where`."""
    bounds = [k for k in ("le", "ge") if isinstance(region, Mapping) and k in region]
    if not isinstance(region, Mapping) or region.get("feature") not in dispatch_rule.FEATURES or len(bounds) != 1 \
            or set(region) != {"feature", *bounds} or not isinstance(region[bounds[0]], (int, float)) \
            or isinstance(region[bounds[0]], bool):
        return [f"{where}: a region is {{'feature': one of {', '.join(dispatch_rule.FEATURES)}, 'le' or 'ge': a "
                f"number}}, got {region!r}"]
    return []


def choose_in(data: Mapping[str, Any], dtype: str, n: int, m: int = 1) -> tuple[str, str] | None:
    """(genome id, why) for M rows of width n in dtype from a table's data: the learned rule's leaf, else the exact
    N's entry, else the dtype's general genome; None when the table has nothing for the dtype."""
    entry = data.get("dtypes", {}).get(dtype)
    if entry is None:
        return None
    if "rule" in entry:
        gid, leaf = dispatch_rule.choose(entry["rule"], dispatch_rule.features(m, n, ELEM_BYTES[dtype]))
        return gid, f"rule leaf {leaf}"
    exact = entry.get("by_n", {}).get(str(n))
    if exact is not None:
        return exact["genome"], f"N={n}"
    return entry["general"]["genome"], "general"


SELECTION_ONLY = "kernel-factory-dispatch/1"   # a table from before launch recipes: its genomes, no kernels


class Table:
    """A loaded table: lookup by (dtype, N). runnable=False reads only the selection (the genomes per dtype and N),
    as a search seeded from a table does; an older table without built kernels is read that way too."""

    def __init__(self, path: str | Path, runnable: bool = True):
        self.path = Path(path)
        try:
            raw = self.path.read_bytes()
            self.sha256 = hashlib.sha256(raw).hexdigest()
            self.data = json.loads(raw)
        except OSError as exc:
            raise TableError(f"cannot read dispatch table {str(self.path)!r}: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise TableError(f"dispatch table {str(self.path)!r} is not JSON: {exc}") from exc
        formats = (FORMAT,) if runnable else (FORMAT, SELECTION_ONLY)
        if not isinstance(self.data, dict) or self.data.get("format") not in formats:
            raise TableError(f"{str(self.path)!r} is not a dispatch table of format {FORMAT!r} "
                             f"(found {self.data.get('format') if isinstance(self.data, dict) else 'no format'}); "
                             f"write one with `kernel-factory export ... --build`")
        for dtype, entry in self.data.get("dtypes", {}).items():
            problems = dispatch_rule.check(entry["rule"], f"{dtype}.rule") if "rule" in entry else []
            problems += [p for i, c in enumerate(entry.get("candidates", []))
                         for p in candidate_problems(c, f"{dtype}.candidates[{i}]")]
            if problems:
                raise TableError(f"dispatch table {str(self.path)!r}: " + "; ".join(problems[:3]))
        for dtype, entry in self.data.get("dtypes", {}).items() if runnable else ():
            for gid in chosen_genomes(entry):
                if f"{gid}:{dtype}" not in self.data.get("kernels", {}):
                    raise TableError(f"dispatch table {str(self.path)!r}: {dtype} dispatches to genome {gid}, which "
                                     f"has no built kernel; re-export with --build")

    @property
    def problem(self) -> str:
        return self.data.get("problem", "")

    def dtypes(self) -> list[str]:
        return sorted(self.data.get("dtypes", {}))

    def choose(self, dtype: str, n: int, m: int = 1) -> tuple[str, str] | None:
        """(genome id, why) for M rows of width n in dtype (choose_in)."""
        return choose_in(self.data, dtype, n, m)

    def kernel(self, dtype: str, n: int, m: int = 1) -> Kernel | None:
        """The kernel entry the dispatch chooses for (dtype, M, N), or None when the table has no such dtype."""
        found = self.choose(dtype, n, m)
        if found is None:
            return None
        return self.entry(*found, dtype)

    def entry(self, gid: str, why: str, dtype: str) -> Kernel:
        """The kernel entry of (genome, dtype); `why` says why it was chosen."""
        rec = self.data["kernels"][f"{gid}:{dtype}"]
        folder = self.path.parent
        return Kernel(gid, dtype, why, folder / rec["cubin"], rec["sha256"], rec["arch"], rec["recipe"],
                      folder / rec["source"] if rec.get("source") else None)

    def kernels_of(self, dtype: str, m: int | None = None, n: int | None = None) -> list[Kernel]:
        """Every built kernel of the dtype (what first-call tuning times: kernels/tune.py), in the table's order;
        given a call's M and N, less the candidates whose region leaves the call out (the rule's own genomes are
        never left out)."""
        outside: set[str] = set()
        if m is not None and n is not None:
            entry = self.data.get("dtypes", {}).get(dtype, {})
            bounded: dict[str, list[Mapping[str, Any]]] = {}
            for c in entry.get("candidates", []):
                if not isinstance(c, str):
                    bounded.setdefault(c["genome"], []).append(c["where"])
            named = {c for c in entry.get("candidates", []) if isinstance(c, str)}
            named |= set(chosen_genomes({**entry, "candidates": []})) if entry else set()
            outside = {g for g, regions in bounded.items()   # listed for several regions: inside any of them
                       if g not in named and not any(in_region(r, dtype, m, n) for r in regions)}
        return [self.entry(key.rsplit(":", 1)[0], "tuned", dtype) for key in self.data.get("kernels", {})
                if key.rsplit(":", 1)[1] == dtype and key.rsplit(":", 1)[0] not in outside]

    def genes(self, genome_id: str) -> dict[str, Any]:
        """A genome's genes as exported (for explaining a choice)."""
        return dict(self.data["genomes"][genome_id]["genes"])
