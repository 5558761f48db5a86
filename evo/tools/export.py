"""`kernel-factory export`: turn what runs measured into a dispatch table for the library ops (see dispatch.py).

Sources are run journals (a run id under the runs folder, a run folder or a journal.jsonl) and recordings
(.jsonl.gz from `kernel-factory record`, which time every genome on every case). Every OK result is a
measurement; per dtype the table gets, for each row width N, the genome with the lowest time at that N (at the
largest M measured for it), and a general genome: the lowest geomean time over the problem's benchmark cases of
that dtype among measurements that cover all of them. Each entry says where its number came from (run, candidate,
time, evaluator kind, GPU), and replayed numbers are labelled "replay".

A run's finalists (its journal's end record: the top candidates re-timed with many repetitions, interleaved with
the baseline) are preferred: their re-timed medians replace the search-time medians of those candidates, and a
finalist whose re-timing failed is left out. Genomes recorded before genes were added to the space get the new
genes' defaults (the convention for a new gene is that its default reproduces the old kernel); each such entry lists
the genes it filled.
"""
from __future__ import annotations

import gzip
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import registry
from . import dispatch
from ..config import ConfigError
from ..evaluate import recording, render
from .. import journal
from ..protocols import Problem
from ..types import Case, Genome, Status

EVALUATOR_KINDS = {
    "gpu": "timed live on the named GPU by a run's GPU evaluator",
    "replay": "REPLAYED: a run that answered from a recording; the times are the recording's (not re-measured)",
    "recording": "read straight from a recording made on the named GPU by `kernel-factory record`",
    "none": "not measured: the problem's default genome, used until a run measures this dtype",
}


class ExportError(ConfigError):
    """A source that cannot be exported (missing, another problem, not a journal or recording)."""


@dataclass(frozen=True)
class Source:
    path: str
    run_id: str
    evaluator: str      # a key of EVALUATOR_KINDS
    gpu: str
    label: str


@dataclass(frozen=True)
class Measurement:
    """One OK result: a genome's median time per case key, and where it came from."""

    source: Source
    candidate_id: str
    genome: Genome
    times_us: Mapping[str, float]
    evaluator: str
    filled: tuple[str, ...] = ()    # genes missing from the measured genome, set to their defaults
    notes: Mapping[str, Any] = field(default_factory=dict)   # timing ("search" or the finalist re-time), flags

    def provenance(self) -> dict[str, Any]:
        out = {"run_id": self.source.run_id, "candidate_id": self.candidate_id, "evaluator": self.evaluator,
               "gpu": self.source.gpu, "source": self.source.path, **self.notes}
        if self.filled:
            out["genes_filled_with_defaults"] = list(self.filled)
        return out


def problem_plugin(name: str) -> Problem:
    """A problem by entry-point name, or from kernel_factory.problems.<name> when not (yet) registered."""
    try:
        return registry.load("problem", name)
    except registry.PluginError as exc:
        import importlib
        try:
            return importlib.import_module(f"kernel_factory.problems.{name}").problem
        except (ImportError, AttributeError):
            raise exc from None


def resolve(spec: str, runs_dir: str | Path) -> Path:
    """The file behind a source argument: a run id under runs_dir, a run folder, a journal or a recording."""
    path = Path(spec)
    if path.is_dir() and (path / journal.NAME).is_file():
        return path / journal.NAME
    if path.is_file():
        return path
    under = Path(runs_dir) / spec / journal.NAME
    if under.is_file():
        return under
    runs = sorted(p.parent.name for p in Path(runs_dir).glob(f"*/{journal.NAME}"))
    raise ExportError(f"no run or recording {spec!r}: not a run folder, journal or recording file, and no "
                      f"{under}; runs under {runs_dir}/: {', '.join(runs) or 'none'}")


def _first_line(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as fh:
            return json.loads(fh.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path} is neither a run journal nor a recording: {exc}") from exc


def read_source(spec: str, problem: Problem, runs_dir: str | Path = "runs") -> tuple[Source, list[Measurement], dict]:
    """A source's OK measurements, and a summary of what was used and skipped."""
    path = resolve(spec, runs_dir)
    head = _first_line(path)
    if head.get("format") == recording.FORMAT:
        source, rows = _from_recording(path, problem)
    elif head.get("event") == "start":
        source, rows = _from_journal(path, problem)
    else:
        raise ExportError(f"{path} is neither a run journal (first record 'start') nor a recording "
                          f"(format {recording.FORMAT})")
    found, skipped = [], {}
    for candidate_id, genes, patch, times, evaluator, notes in rows:
        genome, filled, why = render.adapt(genes, patch, problem)
        why = why or notes.get("skip", "")
        if genome is None or why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        found.append(Measurement(source, candidate_id, genome, times, evaluator, filled, notes))
    return source, found, {**asdict(source), "results_ok": len(rows), "used": len(found), "skipped": skipped}


def _check_problem(path: Path, name: str, problem: Problem) -> None:
    if name != problem.name:
        raise ExportError(f"{path} holds problem {name!r}, not {problem.name!r}; pass --problem {name}")


def _from_journal(path: Path, problem: Problem) -> tuple[Source, list]:
    run = journal.read(path)
    _check_problem(path, run.start.problem, problem)
    ev = run.start.evaluator
    source = Source(str(path), run.run_id, ev.kind, ev.fingerprint.get("gpu", "?"), ev.label)
    finalists = run.finalists()
    rows = []
    for cand, result in run.pairs():
        if result.status != Status.OK:
            continue
        times, notes = dict(result.times_us), {"timing": "search"}
        final = finalists.get(cand.id)
        if final is not None and final.status != Status.OK.value:
            notes["skip"] = f"finalist re-timing failed ({final.status})"
        elif final is not None:
            times.update(final.times_us)
            notes["timing"] = (f"finalist re-time: {final.reps or '?'} repetitions per case, interleaved "
                               f"with the baseline")
        if result.flags:
            notes["flags"] = list(result.flags)
        rows.append((cand.id, cand.genome.gene_dict, cand.genome.patch_dict, times,
                     result.evaluator or source.evaluator, notes))
    return source, rows


def _from_recording(path: Path, problem: Problem) -> tuple[Source, list]:
    try:
        rec = recording.read(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"cannot read recording {path}: {exc}") from exc
    _check_problem(path, rec.header.get("problem", "?"), problem)
    fp = rec.header.get("fingerprint", {})
    gpu = fp.get("gpu", "?")
    label = (f"{gpu} measurements recorded {str(fp.get('date', '?'))[:10]} by `kernel-factory record` "
             f"({len(rec.entries)} genomes, {path.name}, problem v{rec.header.get('problem_version', '?')})")
    source = Source(str(path), f"recording:{path.name}", "recording", gpu, label)
    rows = [(gid, g.gene_dict, g.patch_dict, dict(r.times_us), "recording", {"timing": "recorded"})
            for gid, (g, r) in rec.entries.items() if r.status is Status.OK]
    return source, rows


def _usable(t: Any) -> bool:
    return isinstance(t, (int, float)) and math.isfinite(t) and t > 0


def best_by_n(measurements: Sequence[Measurement], dtype: str) -> dict[int, tuple[Measurement, str, float]]:
    """Row width N -> (measurement, case key, time) with the lowest time at the largest M measured for that N;
    ties go to the smaller genome id, so the choice does not depend on the order of sources."""
    best: dict[int, tuple[tuple, Measurement, str, float]] = {}
    for meas in measurements:
        for key, t in meas.times_us.items():
            case = Case.parse(key)
            if case.dtype != dtype or len(case.shape) != 2 or not _usable(t):
                continue
            m, n = case.shape
            rank = (-m, t, meas.genome.id, meas.candidate_id)
            if n not in best or rank < best[n][0]:
                best[n] = (rank, meas, key, float(t))
    return {n: (meas, key, t) for n, (_, meas, key, t) in sorted(best.items())}


def best_general(measurements: Sequence[Measurement], keys: Sequence[str]) -> tuple[Measurement, float] | None:
    """The measurement with the lowest geomean time over `keys` among those that time every one of them."""
    best = None
    for meas in measurements:
        times = [meas.times_us.get(k) for k in keys]
        if not keys or not all(_usable(t) for t in times):
            continue
        geomean = math.exp(sum(math.log(t) for t in times) / len(times))
        rank = (geomean, meas.genome.id, meas.candidate_id)
        if best is None or rank < best[0]:
            best = (rank, meas, geomean)
    return None if best is None else (best[1], best[2])


def make_table(problem: Problem, measurements: Sequence[Measurement], sources: Sequence[dict]) -> dict[str, Any]:
    genomes: dict[str, Any] = {}
    dtypes: dict[str, Any] = {}
    notes = []
    default = Genome.of(problem.space.defaults())
    for dtype in problem.dtypes:
        bench = [Case(shape, dtype).key for shape in problem.shape_sets["benchmark"]]
        by_n = {}
        for n, (meas, key, t) in best_by_n(measurements, dtype).items():
            genomes[meas.genome.id] = meas.genome.to_json()
            by_n[str(n)] = {"genome": meas.genome.id, "case": key, "time_us": round(t, 4),
                            "provenance": meas.provenance()}
        general = best_general(measurements, bench)
        if general is None:
            genomes[default.id] = default.to_json()
            why = ("no genome was measured on all its benchmark cases" if by_n
                   else "no run has measured this dtype yet")
            notes.append(f"{dtype}: the general genome is the problem's default genome ({why}); every N without "
                         f"an exact entry uses it until a run measures {dtype} on all benchmark cases")
            gen_entry = {"genome": default.id, "provenance": {"evaluator": "none", "note": why}}
        else:
            meas, geomean = general
            genomes[meas.genome.id] = meas.genome.to_json()
            gen_entry = {"genome": meas.genome.id, "geomean_us": round(geomean, 4),
                         "times_us": {k: round(meas.times_us[k], 4) for k in bench},
                         "provenance": meas.provenance()}
        dtypes[dtype] = {"general": gen_entry, "by_n": by_n}
    kinds = sorted({m.evaluator for m in measurements} | ({"none"} if notes else set()))
    if "replay" in kinds or "recording" in kinds:
        notes.append("some entries are not fresh measurements: see each entry's provenance.evaluator")
    return {"format": dispatch.FORMAT, "problem": problem.name, "problem_version": problem.version,
            "kernel_name": problem.kernel_name, "dispatch_key": dispatch.DISPATCH_KEY,
            "selection": ("by_n: lowest time at that N (largest M measured); general: lowest geomean time over the "
                          "dtype's benchmark cases among measurements covering all of them"),
            "evaluator_kinds": {k: EVALUATOR_KINDS.get(k, "unknown") for k in kinds},
            "sources": list(sources), "notes": notes, "genomes": dict(sorted(genomes.items())), "dtypes": dtypes,
            "kernels": {}}


def export(problem_name: str, specs: Sequence[str], out: str | Path, runs_dir: str | Path = "runs",
           build: bool = False) -> tuple[Path, dict[str, Any]]:
    """Read the sources, write the table to `out` (and with build, its cubins to out's folder/cubins)."""
    problem = problem_plugin(problem_name)
    if not specs:
        raise ExportError("name at least one run (a run id, run folder, journal or recording)")
    learned = [s for s in specs if (Path(s) / "workload.json").is_file()]
    if learned:
        return export_learned(problem, learned, specs, Path(out), build)
    measurements, sources = [], []
    for spec in specs:
        _, found, summary = read_source(spec, problem, runs_dir)
        measurements += found
        sources.append(summary)
    if not measurements:
        raise ExportError(f"the sources hold no usable OK result for {problem.name}: "
                          + "; ".join(f"{s['path']}: {s['results_ok']} ok, skipped {s['skipped']}" for s in sources))
    table = make_table(problem, measurements, sources)
    out = Path(out)
    if build:
        dispatch.build(problem, table, out.parent / dispatch.CUBIN_FOLDER)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dispatch.dumps(table))
    return out, table


def export_learned(problem: Problem, campaigns: Sequence[str], specs: Sequence[str], out: Path,
                   build: bool) -> tuple[Path, dict[str, Any]]:
    """A workload campaign's learned table (its folder's kernels/dispatch.json), written to `out` with its kernels
    rebuilt beside it: the op then dispatches by the learned rule."""
    if len(campaigns) != 1 or len(specs) != 1:
        raise ExportError("a workload campaign folder is exported alone: its table is learned, not merged with runs")
    path = Path(campaigns[0]) / "kernels" / "dispatch.json"
    table = dispatch.load(path)
    if table.get("problem") != problem.name:
        raise ExportError(f"{path} is a table for {table.get('problem')!r}, not {problem.name!r}")
    table = {k: v for k, v in table.items() if k != "kernels"}
    table["sources"] = [str(campaigns[0])]
    if build:
        dispatch.build(problem, table, out.parent / dispatch.CUBIN_FOLDER)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dispatch.dumps(table))
    return out, table


def summary(path: Path, table: Mapping[str, Any]) -> str:
    """A few lines for the console: per dtype the general genome and how many widths have an exact entry."""
    lines = [f"dispatch table -> {path} ({len(table['genomes'])} genomes, {len(table['kernels'])} built kernels)"]
    for dtype, entry in table["dtypes"].items():
        gen = entry["general"]
        if "rule" in entry:
            fit = entry.get("fit", {})
            extra = len(entry.get("candidates", []))
            lines.append(f"  {dtype}: learned rule over {len(set(dispatch.op_table.chosen_genomes(entry))) - extra} "
                         f"genomes{f' and {extra} tuning candidates' if extra else ''} (training geomean {fit.get('slowdown', float('nan')):.3f}x the fastest measured per "
                         f"shape), general {gen['genome']}")
            continue
        how = gen["provenance"].get("evaluator")
        lines.append(f"  {dtype}: general {gen['genome']} ({how}), exact N: "
                     f"{', '.join(entry['by_n']) or 'none'}")
    lines += [f"  note: {n}" for n in table.get("notes", [])]
    return "\n".join(lines)
