"""The four plugin contracts: Problem, Operator, Evaluator, Observer, and the small records they exchange.

Plugins import of the factory only its floor 1: this module, `types`, `inputs`, `compiled`, `regions` and `workload`
(plus `kernel_factory.kernels`, numpy, torch and the standard library); docs/adding-a-problem.md states every rule a
problem follows and `kernel-factory check` checks them. Each contract is narrow on purpose; tests/test_contracts.py
holds the conformance suite every entry point passes.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..kernels import recipe
from .types import Candidate, Case, EvalResult, GeneSpace, GeneValue, Genome

SHAPE_SETS = ("benchmark", "correctness", "heldout")


@dataclass(frozen=True)
class Launch:
    """How to launch one compiled kernel on one case: grid, block, dynamic shared memory and arguments.

    args holds torch tensors (passed as device pointers) and numpy scalars (passed by value, typed). `kernel` names
    the extern "C" entry to launch ("" is the problem's kernel_name); `cluster` asks for a thread-block cluster
    (sm_90). Dynamic shared memory above 48 KB is allowed up to the device's opt-in limit.
    """

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[Any, ...]
    kernel: str = ""
    cluster: tuple[int, int, int] | None = None


def launch_steps(plan: "Launch | Sequence[Launch]") -> tuple[Launch, ...]:
    """A problem's launch plan as a sequence: one Launch, or several run in order on the same stream."""
    return (plan,) if isinstance(plan, Launch) else tuple(plan)


SCALARS = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32,
           "f64": np.float64}


def recipe_value(expr: Any, names: Mapping[str, Any]) -> Any:
    """A launch-recipe expression's value (kernels/recipe.py), for plugins that share an expression with Python."""
    return recipe.value(expr, names)


def recipe_names(recipe_: Mapping[str, Any], m: int, n: int, eps: float | None = None,
                 addresses: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Every name a launch recipe defines, for an (m, n) case (what a plugin's checks and tests read)."""
    return recipe.names(recipe_, m, n, eps, addresses)


def _address(t: Any) -> int:
    if type(t).__name__ == "FakeTensor":   # a shape without memory (check's launch limits): take it as aligned
        return 256
    return t.data_ptr()


def launch_from_recipe(recipe_: Mapping[str, Any], case: Case, tensors: Mapping[str, Any],
                       eps: float | None = None, scalars: Mapping[str, float] | None = None) -> tuple[Launch, ...]:
    """The Launch steps of a launch recipe (kernels/recipe.py) for a case of shape (..., N), with its tensors by
    name (and the op's scalars): how problems launch, so that the factory times exactly the plan that export hands to
    the library op."""
    n = case.shape[-1]
    m = math.prod(case.shape[:-1])
    held = {name: t for name, t in tensors.items() if hasattr(t, "data_ptr")}
    plan = recipe.evaluate(recipe_, m, n, eps, {name: _address(t) for name, t in held.items()},
                           {name: (tuple(t.shape), tuple(t.stride())) for name, t in held.items()}, scalars)
    return tuple(Launch(grid=s.grid3, block=s.block3, shared_bytes=s.smem,
                        args=tuple(tensors[a] if kind == "ptr" else SCALARS[kind](a) for kind, a in s.args),
                        kernel=s.kernel, cluster=s.cluster3 if s.cluster3 != (1, 1, 1) else None)
                 for s in plan.steps)


@runtime_checkable
class LaunchRecipe(Protocol):
    """A problem whose launch is a recipe (kernels/recipe.py): what export writes beside each cubin, so that the
    library op launches the kernel without the plugin."""

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]: ...


class MissingBaseline(Exception):
    """A baseline's package is not installed here (e.g. QuACK on a machine without it)."""


@runtime_checkable
class Problem(Protocol):
    """An operation to implement: what to compute, on which inputs, how to check it, and the kernel's gene space."""

    name: str
    version: str
    description: str
    kernel_name: str                                     # the extern "C" entry in the template
    space: GeneSpace
    dtypes: tuple[str, ...]                              # torch dtype names, e.g. "bfloat16"
    shape_sets: Mapping[str, tuple[tuple[int, ...], ...]]  # keys: SHAPE_SETS
    baselines: tuple[str, ...]                           # names accepted by baseline(); the first is the default
    # Optional capabilities, each a protocol below: PublishedPeers, DeclaresPeers, SpecialInputs, RowReference,
    # ExpectedSass, DeclaresDeterminism (see the RMSNorm problems), RaggedShapes.

    def template(self) -> str:
        """CUDA C++ source that compiles as-is: each gene is a #define with a default."""

    def bytes_moved(self, case: Case) -> int:
        """The fewest bytes a kernel must move through device memory for this case."""

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for comparing an output of this dtype with the fp32 reference."""

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        """Fresh random inputs (torch tensors) drawn from `seed` on `device`."""

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        """Output tensors for the kernel to fill (the evaluator poisons them before every launch)."""

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The expected outputs, computed in torch with fp32 (or better) accumulation, keyed like make_outputs."""

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> Launch | Sequence[Launch]:
        """Grid, block and arguments for the kernel compiled from `genes`; several Launches run in order (e.g. a
        main kernel and a final reduction). Scratch buffers belong in make_outputs (only reference keys are
        compared)."""

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        """A zero-argument callable that computes the outputs with baseline `name`; raises MissingBaseline."""


# ---- optional capabilities of a problem: a plugin offers one by having its members; the engine asks isinstance() --

@runtime_checkable
class PublishedPeers(Protocol):
    """Names the baselines that are published kernels: the bench's "best peer" is the fastest of them."""

    peers: tuple[str, ...]


@dataclass(frozen=True)
class Peer:
    """A baseline that bench, heldout and gap time beside ours by default. Each must load and run, or the command
    must be told to go on without it (`--without NAME`), and then every headline says so."""

    baseline: str              # the name baseline() takes
    label: str                 # as headlines name it: "QuACK", "INT21", "torch.compile"
    module: str | None = None  # imported before anything is timed: a peer that cannot load stops the command there
    tuned: bool = False        # tunes itself at each new shape (tens of seconds): timed on the benchmark rows only


@runtime_checkable
class DeclaresPeers(Protocol):
    """Declares the peers the reports time by default (every one, unless a command leaves one out by name)."""

    declared_peers: tuple[Peer, ...]


@runtime_checkable
class SpecialInputs(Protocol):
    """Has adversarial inputs (zero, huge, tiny, denormal rows) that the gate's last launch checks a kernel on."""

    def special_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        ...


@runtime_checkable
class RowReference(Protocol):
    """Computes its reference at chosen rows, for problems whose outputs are not all row-wise (a backward's dw sums
    over rows): row_outputs names the outputs split by rows, the others are compared whole."""

    row_outputs: tuple[str, ...]

    def reference_rows(self, inputs: Mapping[str, Any], rows: Any) -> dict[str, Any]:
        ...


@runtime_checkable
class ExpectedSass(Protocol):
    """Says what each PTX choice must leave in the binary: (opcode regex at the start, must be present?, why)."""

    def expected_sass(self, genes: Mapping[str, GeneValue], dtype: str) -> list[tuple[str, bool, str]]:
        ...


@runtime_checkable
class RaggedShapes(Protocol):
    """Has shapes whose trailing dims are a list as long as a case needs: `fixed_dims` leading dims, then one or more
    (e.g. (heads, then each packed sequence's length) for attention over sequences of several lengths); the
    shape-sets rule checks that instead of one rank."""

    fixed_dims: int


@runtime_checkable
class DeclaresDeterminism(Protocol):
    """Declares whether its kernels give bitwise-equal outputs on a repeated launch (the gate checks that they do
    unless `deterministic` is False, e.g. for atomics)."""

    deterministic: bool


@runtime_checkable
class Operator(Protocol):
    """Makes one child genome from `arity` parents. Never mutates a parent; all randomness comes from `rng`."""

    name: str
    arity: int

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        ...


@dataclass(frozen=True)
class OperatorContext:
    """What an operator that reads more than genomes (an LLM operator) is told before each generation."""

    problem: Problem
    results: Mapping[str, tuple[Candidate, EvalResult]]   # this run's evaluations so far, by candidate id
    lessons: str                                          # the lessons document (markdown), "" when off
    fingerprint: Mapping[str, str]                        # the evaluator's (gpu, copy_gbps, baseline, ...)
    generation: int                                       # the generation about to be proposed
    render: Callable[[Candidate, str], str]               # a candidate's CUDA source for a dtype, as compiled
    shared: dict[str, Any] = field(default_factory=dict)  # state the run's operators share (the LLM spend)


@runtime_checkable
class MaybeUnavailable(Protocol):
    """An operator that can be out of service (no endpoint configured, budget spent): unavailable says why, or is
    None. The proposer skips it while it is."""

    unavailable: str | None


@runtime_checkable
class ContextOperator(Operator, MaybeUnavailable, Protocol):
    """An operator that is attached to the run's context once per generation and makes whole candidates: with
    notes, and with a failure when it already knows the outcome. Each make() may cost money, so the proposer calls
    it once per child slot (no retries, oversampling or screening)."""

    def attach(self, context: OperatorContext) -> None:
        ...

    def make(self, parents: Sequence[Candidate], space: GeneSpace, rng: random.Random) -> Candidate:
        ...


@runtime_checkable
class RepairOperator(ContextOperator, Protocol):
    """A context operator whose parents are failures: the proposer offers it the previous generation's results,
    and it chooses (within its own bounds) the candidates to repair, one child each."""

    def choose(self, results: Sequence[tuple[Candidate, EvalResult]]) -> list[Candidate]:
        ...


@dataclass(frozen=True)
class EvaluatorInfo:
    """What an evaluator is and where its numbers come from; logged as tags on every run."""

    kind: str                        # "gpu" or "replay"
    label: str                       # one human line, e.g. "replay of H200 measurements recorded 2026-11-30"
    fingerprint: Mapping[str, str] = field(default_factory=dict)

    def replay_note(self) -> str:
        """"" for live measurements; for a replay, the one line every place that shows its numbers carries."""
        return replay_note(self.kind, self.label)


def replay_note(kind: str, label: str) -> str:
    """The label of replayed numbers: recorded earlier, on another machine; nothing ran in this run."""
    if kind != "replay":
        return ""
    return f"REPLAY: recorded measurements ({label}); no kernel ran in this run"


@runtime_checkable
class Evaluator(Protocol):
    """Turns candidates into results. Failures come back as statuses; evaluate() raises only on our own bugs."""

    info: EvaluatorInfo

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class Retimes(Protocol):
    """An evaluator that can re-time finalists against the baseline, interleaved with many repetitions (GPU): one
    record per candidate (status, per-case medians and IQRs of both, speedup)."""

    def retime(self, candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
        ...


@runtime_checkable
class Races(Protocol):
    """An evaluator that can time in two legs (racing, evaluate/racing.py): time_first gates each candidate in full
    and times it on `cases` only (the result's times_us holds those cases, its gpu_s what that leg cost);
    time_rest times candidates that passed it on every other benchmark case, without gating them again, and
    returns the whole result (all cases; gpu_s the second leg's cost)."""

    def time_first(self, candidates: Sequence[Candidate], cases: Sequence[str]) -> list[EvalResult]:
        ...

    def time_rest(self, candidates: Sequence[Candidate], first: Sequence[EvalResult]) -> list[EvalResult]:
        ...


@runtime_checkable
class RecordedSpace(Protocol):
    """An evaluator that answers only within a space of its own (a replay: what its recording covers)."""

    space: GeneSpace


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    problem: str
    seed: int
    config: Mapping[str, Any]       # the resolved config, every default filled in
    evaluator: EvaluatorInfo
    cases: tuple[Case, ...]
    out_dir: str
    cases_key: str = ""             # names (problem, cases, baseline): fitness is comparable across runs with one key
    warm_start: tuple[str, ...] = ()   # genome ids seeded from earlier runs
    prior_records: int = 0          # candidates of earlier runs that credit, lessons and the surrogate learn from
    resumed: bool = False           # True when `kernel-factory resume` continues a killed run
    warm_start_from: Mapping[str, str] = field(default_factory=dict)   # warm-start genome id -> the run that bred it
    # warm-start genome id -> the candidate that bred it: {"run": run id, "candidate": its id, "generation": N}
    warm_start_origin: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class GenerationStats:
    generation: int
    evaluations: int                # evaluated so far in the run
    best_fitness: float
    median_fitness: float
    best_id: str
    counts: Mapping[str, int]       # status -> count among this generation's new evaluations
    wall_s: float
    operator_probs: Mapping[str, float] = field(default_factory=dict)   # used to breed the next generation
    lessons: int = 0                # lessons in force for the next generation
    population: tuple[str, ...] = ()   # candidate ids that survived selection


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    generations: int
    evaluations: int
    stop_reason: str
    wall_s: float
    gpu_s: float
    best: tuple[Candidate, EvalResult] | None
    hall_of_fame: tuple[tuple[Candidate, EvalResult], ...]
    logbook: tuple[Mapping[str, Any], ...] = ()   # one row per generation (DEAP Logbook)
    lessons: str = ""               # the lessons document (markdown), with operator credit
    finalists: tuple[Mapping[str, Any], ...] = ()  # re-timed against the baseline, interleaved (GPU runs only)
    timed_per_gpu_minute: float = 0.0  # candidates checked and timed on the GPU per GPU-minute (reuses not counted)
    accounting: Mapping[str, Any] = field(default_factory=dict)  # accounting.of(): per-GPU seconds, compile, queue


def throughput(results: Sequence[EvalResult]) -> float:
    """Candidates that the GPU gated and timed, per minute of GPU-worker time spent on all of them. Answers reused
    from a cache (identical binaries, a resumed journal) and replayed results count for nothing."""
    live = [r for r in results if r.evaluator == "gpu" and r.gpu_s > 0]
    gpu_s = sum(r.gpu_s for r in live)
    timed = sum(1 for r in live if r.times_us)
    return timed / (gpu_s / 60) if gpu_s > 0 else 0.0


@runtime_checkable
class Observer(Protocol):
    """Watches a run. Observers never change the search; they record it (journal, MLflow, console). One that
    writes to a store may also have `preflight(run_id, resumed) -> bool`, called before the run folder is made and
    anything is evaluated (evo/run.py): it raises ConfigError for a store that cannot be used or that already holds
    a new run's id, and returns False when it sits the run out (MLflow with tracking.optional)."""

    def on_start(self, run: RunInfo) -> None:
        ...

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        ...

    def on_generation(self, stats: GenerationStats) -> None:
        ...

    def on_end(self, summary: RunSummary) -> None:
        ...
