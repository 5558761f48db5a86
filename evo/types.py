"""Records that flow through the factory: genes, genomes, candidates, cases and evaluation results.

Everything here is plain, frozen data with no CUDA, torch or MLflow in sight, so plugins, the loop, the journal
and the tests can all share it. Identity is content: a genome's id is the hash of its genes and patch.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

GeneValue = int | str | bool

# A gene becomes the C macro NAME (its name in capitals) and a named choice the constant NAME_CHOICE: both must be C
# identifiers, or the preprocessor reads `STORE_WT-THROUGH` as `STORE_WT - THROUGH` (0 - 0) and the candidate
# silently compiles as the gene's first choice.
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CHOICE_NAME = re.compile(r"[A-Za-z0-9_]+")
RESERVED_MACROS = ("DTYPE",)   # the render's own macro (and its DTYPE_* codes)


class Status(str, enum.Enum):
    """What happened to a candidate. Every failure is a value, never an exception in the loop."""

    OK = "ok"                       # compiled, correct, timed
    COMPILE_ERROR = "compile_error"  # NVRTC/ptxas rejected the source
    INCORRECT = "incorrect"          # ran, but an output missed the reference (NaN included)
    CRASHED = "crashed"              # illegal address, trap, ... (the worker was restarted)
    TIMEOUT = "timeout"              # past the watchdog deadline (the worker was killed)
    NOT_RECORDED = "not_recorded"    # replay only: the recording holds no measurement for this genome
    INVALID_PATCH = "invalid_patch"  # a code edit that does not apply (SEARCH not found, unknown region, no edit)
    REJECTED = "rejected"            # a code edit the static check refused (host code, includes, clocks, ...)
    LLM_ERROR = "llm_error"          # the model endpoint failed (timeout, errors after retries, budget spent)
    SUSPECT = "suspect"              # correct, but timed faster than the roofline allows even after a re-check
    INFEASIBLE = "infeasible"        # a child the problem's rule refused before compiling (the rule's reason)
    # Racing (evaluate/racing.py): passed the gate, timed on the cheap cases only, and cut because it could not reach
    # the running top-k there. Not a failure and not a fitness: its evidence is EvalResult.race.
    CUT = "cut"

    @property
    def failed(self) -> bool:
        """Something went wrong with the candidate (a cut one did not fail: it was outrun)."""
        return self not in (Status.OK, Status.CUT)


@dataclass(frozen=True)
class Gene:
    """One structured choice of a kernel template, rendered as `#define NAME value`.

    `kind` is "structure" (tiling, threads, pipeline) or "ptx" (which instruction is emitted); the PTX-choice
    mutation touches only "ptx" genes.
    """

    name: str
    choices: tuple[GeneValue, ...]
    default: GeneValue
    kind: str = "structure"
    doc: str = ""

    def __post_init__(self) -> None:
        if self.default not in self.choices:
            raise ValueError(f"gene {self.name}: default {self.default!r} is not one of {self.choices}")
        if self.kind not in ("structure", "ptx"):
            raise ValueError(f"gene {self.name}: kind must be 'structure' or 'ptx', got {self.kind!r}")
        for why in self.naming_faults():
            raise ValueError(why)

    def naming_faults(self) -> list[str]:
        """Why this gene's name or named choices cannot be C macros, one line each (empty when they can)."""
        if not isinstance(self.name, str) or not C_IDENTIFIER.fullmatch(self.name):
            return [f"gene {self.name!r}: the name must be a C identifier (letters, digits and _, not starting with "
                    f"a digit): it becomes the macro {str(self.name).upper()}"]
        if self.name.upper() in RESERVED_MACROS or self.name.upper().startswith("DTYPE_"):
            return [f"gene {self.name!r}: {self.name.upper()} is the dtype's macro; choose another name"]
        faults, seen = [], {}
        for choice in self.choices:
            if isinstance(choice, str) and not CHOICE_NAME.fullmatch(choice):
                fixed = re.sub(r"[^A-Za-z0-9_]", "_", choice) or "a_name"
                faults.append(f"gene {self.name!r}: choice {choice!r} is not a C identifier: it would become "
                              f"{self.define(choice)}, which the preprocessor does not read as one name (and the "
                              f"candidate compiles as another choice); use letters, digits and _, e.g. {fixed!r}")
            elif isinstance(choice, str) and self.define(choice) in seen:
                faults.append(f"gene {self.name!r}: choices {seen[self.define(choice)]!r} and {choice!r} both "
                              f"become {self.define(choice)}; choose names that differ in more than case")
            if isinstance(choice, str):
                seen.setdefault(self.define(choice), choice)
        if len(set(map(repr, self.choices))) != len(self.choices):
            faults.append(f"gene {self.name!r}: a choice appears twice in {self.choices}")
        return faults

    def define(self, value: GeneValue) -> str:
        """The C preprocessor value: ints as-is, bools as 0/1, strings as NAME_VALUE enum constants."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return str(value)
        return f"{self.name}_{value}".upper()


@dataclass(frozen=True)
class GeneSpace:
    """The structured part of a genome: named genes plus a feasibility rule over a full assignment."""

    genes: tuple[Gene, ...]
    rule: Callable[[Mapping[str, GeneValue]], str | None] = lambda genes: None

    def __post_init__(self) -> None:
        for why in self.macro_clashes():
            raise ValueError(why)

    def macro_clashes(self) -> list[str]:
        """Two genes whose macros (NAME, NAME_CHOICE) are the same C name, one line each."""
        owner: dict[str, str] = {}
        clashes = []
        for gene in self.genes:
            names = [gene.name.upper(), *(gene.define(c) for c in gene.choices if isinstance(c, str))]
            for macro in names:
                if macro in owner and owner[macro] != gene.name:
                    clashes.append(f"genes {owner[macro]!r} and {gene.name!r} both define the macro {macro}")
                elif macro in owner:
                    clashes.append(f"gene {gene.name!r} is named twice in the space")
                owner.setdefault(macro, gene.name)
        return clashes

    def __getitem__(self, name: str) -> Gene:
        for gene in self.genes:
            if gene.name == name:
                return gene
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.genes)

    def defaults(self) -> dict[str, GeneValue]:
        return {g.name: g.default for g in self.genes}

    def why_infeasible(self, genes: Mapping[str, GeneValue]) -> str | None:
        """None if the assignment can be compiled and launched, else the reason it cannot."""
        if set(genes) != set(self.names):
            return f"genes {sorted(genes)} do not match the space {sorted(self.names)}"
        for gene in self.genes:
            if genes[gene.name] not in gene.choices:
                return f"{gene.name}={genes[gene.name]!r} is not one of {gene.choices}"
        return self.rule(genes)

    def size(self) -> int:
        return math.prod(len(g.choices) for g in self.genes)

    def restricted(self, choices: Mapping[str, tuple[GeneValue, ...]]) -> "GeneSpace":
        """The same space with some genes limited to the given choices (e.g. what a recording covers); a gene
        whose default is not kept gets its first kept choice as default."""
        genes = []
        for g in self.genes:
            keep = tuple(v for v in g.choices if v in choices.get(g.name, g.choices))
            if not keep:
                raise ValueError(f"gene {g.name}: none of {choices[g.name]!r} is one of {g.choices}")
            genes.append(Gene(g.name, keep, g.default if g.default in keep else keep[0], g.kind, g.doc))
        return GeneSpace(tuple(genes), self.rule)

    def enumerate(self) -> Iterator[dict[str, GeneValue]]:
        """Every feasible assignment, in a fixed order (choices in declared order, last gene fastest)."""
        def walk(i: int, acc: dict[str, GeneValue]) -> Iterator[dict[str, GeneValue]]:
            if i == len(self.genes):
                if self.rule(acc) is None:
                    yield dict(acc)
                return
            for value in self.genes[i].choices:
                acc[self.genes[i].name] = value
                yield from walk(i + 1, acc)
        yield from walk(0, {})


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Genome:
    """Gene values plus an optional code patch for the template's editable regions (region name -> code)."""

    genes: tuple[tuple[str, GeneValue], ...]
    patch: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(genes: Mapping[str, GeneValue], patch: Mapping[str, str] | None = None) -> "Genome":
        return Genome(tuple(sorted(genes.items())), tuple(sorted((patch or {}).items())))

    @property
    def gene_dict(self) -> dict[str, GeneValue]:
        return dict(self.genes)

    @property
    def patch_dict(self) -> dict[str, str]:
        return dict(self.patch)

    @functools.cached_property
    def id(self) -> str:
        """Content hash: the same genes and patch give the same id in every run and on every machine. Computed once
        per object (library ops look genomes up by id on every call)."""
        payload = canonical_json({"genes": self.gene_dict, "patch": self.patch_dict})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return {"genes": self.gene_dict, "patch": self.patch_dict}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Genome":
        return Genome.of(data["genes"], data.get("patch") or {})


@dataclass(frozen=True)
class Candidate:
    """A genome in the context of one run: who its parents were and which operator made it.

    notes are text artifacts about how it was made (an LLM operator's prompt, reply, diff, usage), logged with the
    candidate. failure is set when the operator already knows the outcome (an edit that does not apply, a failed
    model call): such a candidate is recorded with that status and never reaches the evaluator."""

    genome: Genome
    parents: tuple[str, ...] = ()
    operator: str = "init"
    generation: int = 0
    notes: Mapping[str, str] = field(default_factory=dict, compare=False)
    failure: tuple[str, str] | None = field(default=None, compare=False)   # (Status value, message)

    @property
    def id(self) -> str:
        return self.genome.id

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "genome": self.genome.to_json(), "parents": list(self.parents),
                "operator": self.operator, "generation": self.generation, "notes": dict(self.notes),
                "failure": list(self.failure) if self.failure else None}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Candidate":
        failure = data.get("failure")
        return Candidate(Genome.from_json(data["genome"]), tuple(data["parents"]), data["operator"],
                         int(data["generation"]), dict(data.get("notes") or {}), tuple(failure) if failure else None)


@dataclass(frozen=True)
class Case:
    """One problem instance: a shape (problem-defined meaning, e.g. (M, N)) and the input dtype."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def key(self) -> str:
        return f"{self.dtype}:{'x'.join(map(str, self.shape))}"

    @staticmethod
    def parse(key: str) -> "Case":
        dtype, dims = key.split(":")
        return Case(tuple(int(d) for d in dims.split("x")), dtype)


@dataclass(frozen=True)
class BuildInfo:
    """What the compiler said about one binary (per dtype when a genome is compiled for several)."""

    registers: int | None = None
    spill_stores: int = 0
    spill_loads: int = 0
    shared_bytes: int = 0
    local_bytes: int = 0
    compile_s: float = 0.0
    cached: bool = False
    log: str = ""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class EvalResult:
    """The outcome of evaluating one candidate: status first, then the evidence.

    times_us / baseline_us are medians per benchmark case key; iqr_us the interquartile range of the candidate's
    samples. fitness is the geomean over benchmark cases of baseline_us / times_us (higher is better), and 0.0 for
    any failure, so selection never prefers a broken kernel.
    """

    candidate_id: str
    status: Status
    fitness: float = 0.0
    times_us: Mapping[str, float] = field(default_factory=dict)
    iqr_us: Mapping[str, float] = field(default_factory=dict)
    baseline_us: Mapping[str, float] = field(default_factory=dict)
    gbps: Mapping[str, float] = field(default_factory=dict)
    build: Mapping[str, BuildInfo] = field(default_factory=dict)
    message: str = ""
    evaluator: str = ""
    gpu_s: float = 0.0
    flags: tuple[str, ...] = ()      # facts that do not fail a candidate but must be seen (binary contradicts genes)
    # A cut candidate's evidence (status cut): the cases timed, their times and IQRs, the bound and the threshold.
    # Its times stay out of times_us, so that nothing takes them for a measured fitness or a case champion.
    race: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"candidate_id": self.candidate_id, "status": self.status.value, "fitness": self.fitness,
               "times_us": dict(self.times_us), "iqr_us": dict(self.iqr_us),
               "baseline_us": dict(self.baseline_us), "gbps": dict(self.gbps),
               "build": {k: v.to_json() for k, v in self.build.items()}, "message": self.message,
               "evaluator": self.evaluator, "gpu_s": self.gpu_s}
        if self.flags:
            out["flags"] = list(self.flags)
        if self.race:
            out["race"] = dict(self.race)
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "EvalResult":
        return EvalResult(data["candidate_id"], Status(data["status"]), float(data["fitness"]),
                          dict(data.get("times_us", {})), dict(data.get("iqr_us", {})),
                          dict(data.get("baseline_us", {})), dict(data.get("gbps", {})),
                          {k: BuildInfo(**v) for k, v in data.get("build", {}).items()},
                          data.get("message", ""), data.get("evaluator", ""), float(data.get("gpu_s", 0.0)),
                          tuple(data.get("flags", ())), dict(data.get("race") or {}))


def geomean_speedup(times_us: Mapping[str, float], baseline_us: Mapping[str, float]) -> float:
    """Geomean over the cases of baseline / candidate; 0.0 if any case is missing or not positive."""
    if not times_us or set(times_us) != set(baseline_us):
        return 0.0
    logs = []
    for key, t in times_us.items():
        b = baseline_us[key]
        if not (t > 0 and b > 0 and math.isfinite(t) and math.isfinite(b)):
            return 0.0
        logs.append(math.log(b / t))
    return math.exp(sum(logs) / len(logs))
