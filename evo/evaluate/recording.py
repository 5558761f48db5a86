"""The recording format: measurements of a problem's structured space made on a real GPU, as gzip'd JSON lines.

Line 1 is a header (problem, cases, baseline and its times, copy bandwidth, environment fingerprint, sampling
rule, timing policy); every further line is one genome's result. A result may be a failure (compile_error with the
compiler's log in its message, incorrect, crashed, ...): `kernel-factory record` keeps what fails on the GPU, and
`kernel-factory record --cpu-failures` adds the genomes outside the problem's rule that NVRTC/ptxas reject on the
CPU, each marked `"outside_rule": <the rule's reason>` (the header's "cpu_failures" says how and when). While recording, lines are appended (and
fsync'd) to `<name>.partial.jsonl`, so an interrupted recording resumes where it stopped. A resumed recording
(possibly on another machine) adds a `resume` line with that machine's fingerprint and baseline and a re-measure
of a few genomes recorded before, so that any drift between the parts is on record; the final header lists them
under "resumes".
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ..types import EvalResult, GeneSpace, GeneValue, Genome

FORMAT = "kernel-factory-recording/1"


@dataclass(frozen=True)
class Recording:
    header: Mapping[str, Any]
    entries: Mapping[str, tuple[Genome, EvalResult]]   # genome id -> (genome, result)
    path: Path
    outside_rule: Mapping[str, str] = dataclasses.field(default_factory=dict)   # genome id -> the rule's reason

    @property
    def failures(self) -> int:
        return sum(result.status.failed for _, result in self.entries.values())

    @property
    def label(self) -> str:
        fp = self.header.get("fingerprint", {})
        failed = f", {self.failures} of them failures" if self.failures else ""
        return (f"replay of {fp.get('gpu', 'GPU')} measurements recorded {fp.get('date', '?')[:10]} "
                f"({len(self.entries)} genomes{failed}, {self.path.name})")


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    return   # a torn last line of an interrupted partial file


def header(path: str | Path) -> dict[str, Any]:
    """A recording's header alone (its problem, cases, space and machine), without reading its entries."""
    first = next(_lines(Path(path)), None)
    if not first or first.get("format") != FORMAT:
        raise ValueError(f"{path} is not a kernel-factory recording (expected format {FORMAT})")
    return first


def partial_path(final: str | Path) -> Path:
    """Where a recording bound for `final` keeps its results until it finishes."""
    final = Path(final)
    return final.with_name(final.name.replace(".jsonl.gz", "") + ".partial.jsonl")


def read(path: str | Path) -> Recording:
    path = Path(path)
    lines = _lines(path)
    header = next(lines, None)
    if not header or header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a kernel-factory recording (expected format {FORMAT})")
    entries, resumes, outside = {}, [], {}
    for row in lines:
        if "resume" in row:
            resumes.append(row["resume"])
            continue
        genome = Genome.from_json(row["genome"])
        entries[genome.id] = (genome, EvalResult.from_json({**row["result"], "candidate_id": genome.id, "fitness": 0.0}))
        if "outside_rule" in row:
            outside[genome.id] = row["outside_rule"]
    if resumes:
        header = {**header, "resumes": list(header.get("resumes", [])) + resumes}
    return Recording(header, entries, path, outside)


class Writer:
    """Appends results to DIR/NAME.partial.jsonl (fsync'd), then `finish()` compresses it to the final path."""

    def __init__(self, final: str | Path, header: Mapping[str, Any]):
        self.final = Path(final)
        self.partial = partial_path(self.final)
        self.done: set[str] = set()
        if self.partial.exists():
            old = read(self.partial)
            if old.header.get("problem") != header.get("problem") or old.header.get("cases") != header.get("cases"):
                raise ValueError(f"{self.partial} belongs to another problem or case list; move it away first")
            self.done = set(old.entries)
            self._rewrite_clean(old)
        else:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self._append({"format": FORMAT, **header})

    def _rewrite_clean(self, old: Recording) -> None:
        """Drop a torn last line by rewriting what was read intact."""
        tmp = self.partial.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(dict(old.header)) + "\n")   # resumes so far now live in the header
            for gid, (genome, result) in old.entries.items():
                fh.write(json.dumps(entry(genome, result, old.outside_rule.get(gid))) + "\n")
        os.replace(tmp, self.partial)

    def _append(self, *rows: Mapping[str, Any]) -> None:
        with open(self.partial, "a") as fh:
            fh.write("".join(json.dumps(row) + "\n" for row in rows))
            fh.flush()
            os.fsync(fh.fileno())

    def add_resume(self, info: Mapping[str, Any]) -> None:
        self._append({"resume": dict(info)})

    def add(self, genome: Genome, result: EvalResult, outside_rule: str | None = None) -> None:
        self._append(entry(genome, result, outside_rule))
        self.done.add(genome.id)

    def add_all(self, measured: Iterable[tuple[Genome, EvalResult]]) -> None:
        """Many genomes in one write and one fsync (a recording made from known times, not one measured at a time)."""
        pairs = list(measured)
        self._append(*(entry(genome, result) for genome, result in pairs))
        self.done.update(genome.id for genome, _ in pairs)

    def finish(self, header_updates: Mapping[str, Any] | None = None) -> Path:
        rec = read(self.partial)
        with gzip.open(self.final, "wt", compresslevel=9) as fh:
            fh.write(json.dumps({**rec.header, **(header_updates or {})}) + "\n")
            for genome, result in rec.entries.values():
                fh.write(json.dumps(entry(genome, result)) + "\n")
        self.partial.unlink()
        return self.final


def entry(genome: Genome, result: EvalResult, outside_rule: str | None = None) -> dict[str, Any]:
    """One genome's line. A build log is dropped (a failure's log is its message); `outside_rule` marks a genome
    the problem's rule rejects, recorded for the failure it is."""
    data = result.to_json()
    for key in ("candidate_id", "baseline_us", "evaluator", "fitness", "gbps"):
        data.pop(key)   # derivable from the header and times; keeps the file small
    for build in data["build"].values():
        build.pop("log", None)
        build.pop("cached", None)
    row = {"genome": genome.to_json(), "result": data}
    return row | ({"outside_rule": outside_rule} if outside_rule else {})


def write(rec: Recording, path: str | Path, header_updates: Mapping[str, Any] | None = None) -> Path:
    """The whole recording to `path` (gzip'd), through a temporary file so that a reader never sees half of it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as fh:
        fh.write(json.dumps({**rec.header, **(header_updates or {})}) + "\n")
        for gid, (genome, result) in rec.entries.items():
            fh.write(json.dumps(entry(genome, result, rec.outside_rule.get(gid))) + "\n")
    os.replace(tmp, path)
    return path


def covered_choices(header: Mapping[str, Any], space: GeneSpace) -> dict[str, tuple[GeneValue, ...]]:
    """Per gene of today's space, the values the recording measured: a gene added after it was made is covered
    at its default only (templates keep old genomes' meaning when they grow)."""
    recorded = header.get("space", {})
    return {g.name: tuple(v for v in g.choices if v in recorded[g.name]) if g.name in recorded else (g.default,)
            for g in space.genes}


def expand(rec: Recording, space: GeneSpace) -> Recording:
    """The recording keyed by today's genomes: genes it predates are filled in with their defaults."""
    defaults = space.defaults()
    entries, outside = {}, {}
    for gid, (genome, result) in rec.entries.items():
        full = Genome.of({**defaults, **genome.gene_dict}, genome.patch_dict)
        entries[full.id] = (full, dataclasses.replace(result, candidate_id=full.id))
        if gid in rec.outside_rule:
            outside[full.id] = rec.outside_rule[gid]
    return Recording(rec.header, entries, rec.path, outside)
