"""`kernel-factory bench`: one kernel against every baseline available, side by side in one process on one GPU.

Every provider (the subject and each baseline) is first checked against the fp32 reference on the row's inputs:
the subject must pass the problem's tolerance; a baseline outside it is still timed and the row notes how far off it
is (a peer that accumulates in bf16, say), while one that fails to run is reported without a time. Then all are timed interleaved sample by sample (A B C A B C ..., an L2 flush before each sample), so
that clock or thermal drift falls on all alike. Launches shorter than --graph-below-us are timed as CUDA-graph
replays where the provider can be captured, and the row says so. `--repeat 2` times the subject a second time in
a separate pass and reports how far the two medians of each row are apart. Results: a table (worst rows first),
CSV, JSON and a PNG, each with the environment fingerprint (bench_report.py renders them; `--from` re-renders a
recorded JSON on a machine without a GPU).
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import registry
from ..build import shapes_of
from ..config import ConfigError
from ..evaluate import gate, launcher, measure, render
from ..evaluate.compile import CompileJob, Compiler
from ..protocols import MissingBaseline, Problem, PublishedPeers
from ..types import Candidate, Case, Genome, GeneValue

SUBJECT = "factory"
COPY = "copy"   # a device copy moving the row's bytes, timed with the providers: the row's own roofline


def peer_set(result: Mapping[str, Any]) -> list[str]:
    """The baselines that define the best peer in a bench result: the problem's published peers that were benched
    (run() records them), else every baseline."""
    return list(result.get("peers") or result["baselines"])


@dataclass(frozen=True)
class Subject:
    """What is benchmarked: per case the genes to launch (a genome, a run's best, a dispatch table), or the
    exported library op (genes_for is None; the problem's 'factory_op' baseline calls it)."""

    label: str
    genes_for: Callable[[Case], Mapping[str, GeneValue]] | None


def parse_cases(problem: Problem, shapes: str, dtypes: Sequence[str]) -> list[Case]:
    """`benchmark`, `heldout`, `correctness` or a comma list of MxN, for each dtype."""
    chosen = shapes_of(problem, shapes, "--shapes")
    bad = [d for d in dtypes if d not in problem.dtypes]
    if bad:
        raise ConfigError(f"--dtypes: {problem.name} has no dtype {bad[0]!r}; it has {', '.join(problem.dtypes)}")
    return [Case(s, d) for d in dtypes for s in chosen]


class Compiled:
    """Cubins for the subject's genomes, compiled on the CPU pool and loaded once per (genome, dtype)."""

    def __init__(self, problem: Problem, cache_dir: str):
        self.problem = problem
        self.compiler = Compiler(cache_dir)
        self.modules: dict[tuple[str, str], launcher.Module] = {}

    def module(self, genes: Mapping[str, GeneValue], dtype: str) -> launcher.Module:
        genome = Genome.of(genes)
        if (genome.id, dtype) not in self.modules:
            body = render.body(self.problem, genome, dtype)
            job = CompileJob(self.compiler.key(body), render.render(self.problem, Candidate(genome), dtype),
                             f"{genome.id}-{dtype}.cu")
            (out,) = list(self.compiler.compile_many([job]))
            if out.error is not None:
                raise ConfigError(f"the subject genome {genome.id} does not compile for {dtype}:\n{out.error[:1500]}")
            self.modules[(genome.id, dtype)] = launcher.Module(out.cubin, self.problem.kernel_name)
        return self.modules[(genome.id, dtype)]


def providers(problem: Problem, subject: Subject, compiled: Compiled, stream: Any, case: Case,
              inputs: Mapping[str, Any], baselines: Sequence[str]) -> dict[str, Callable[[], Mapping[str, Any]] | str]:
    """name -> zero-argument callable returning the outputs, or a string saying why it is unavailable."""
    out: dict[str, Any] = {}
    if subject.genes_for is None:
        try:
            out[SUBJECT] = problem.baseline("factory_op", case, inputs)
        except MissingBaseline as exc:
            out[SUBJECT] = f"unavailable: {exc}"
    else:
        genes = subject.genes_for(case)
        outputs = problem.make_outputs(case, "cuda")
        gate.poison(outputs)   # the first call (the check) must write every output
        run = launcher.launcher(stream, compiled.module(genes, case.dtype),
                                problem.launch(genes, case, inputs, outputs))
        out[SUBJECT] = lambda: (run(), outputs)[1]
    for name in baselines:
        try:
            out[name] = problem.baseline(name, case, inputs)
        except MissingBaseline as exc:
            out[name] = f"unavailable: {exc}"
        except Exception as exc:  # a peer whose setup rejects this shape (e.g. a block size limit)
            out[name] = f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return out


def check(problem: Problem, case: Case, inputs: Mapping[str, Any], fn: Callable[[], Mapping[str, Any]]) -> str | None:
    """None if the provider's outputs match the reference on these inputs (only the outputs it returns)."""
    import torch
    try:
        got = fn()
        torch.cuda.synchronize()
    except Exception as exc:  # a baseline that fails on this shape (e.g. an autotuner config that cannot launch)
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    ref = problem.reference(inputs)
    for name, want in ref.items():
        if name in got:
            bad = measure.mismatch(got[name], want, *measure.tolerance_of(problem, name, case.dtype), name)
            if bad:
                return f"incorrect: {bad}"
    return None


def bench_case(problem: Problem, subject: Subject, compiled: Compiled, timer: measure.Timer, stream: Any,
               case: Case, baselines: Sequence[str], reps: int, repeat: int, copy_gbps: float) -> dict[str, Any]:
    import torch
    inputs = problem.make_inputs(case, seed=2026, device="cuda")
    row: dict[str, Any] = {"case": case.key, "dtype": case.dtype, "shape": list(case.shape),
                           "bytes": problem.bytes_moved(case), "providers": {}}
    fns = providers(problem, subject, compiled, stream, case, inputs, baselines)
    ready: dict[str, Callable[[], Any]] = {}
    notes: dict[str, str] = {}
    for name, fn in fns.items():
        why = fn if isinstance(fn, str) else check(problem, case, inputs, fn)
        if why and (name == SUBJECT or not why.startswith("incorrect")):
            row["providers"][name] = {"error": why}
            continue
        if why:   # a peer outside our tolerance (e.g. bf16 accumulation) is still timed, and the row says so
            notes[name] = why
        ready[name] = fn
    ready[COPY] = row_copy(row["bytes"])
    timed, graphed = graph_where_short(timer, ready)
    for rep in range(max(1, repeat) if SUBJECT in timed else 1):
        names = list(timed) if rep == 0 else [SUBJECT]
        for name, t in zip(names, timer.time_interleaved([timed[n] for n in names], reps)):
            if rep == 0:
                gbps = row["bytes"] / (t.median_us * 1e-6) / 1e9
                row["providers"][name] = {"us": t.median_us, "iqr_us": t.iqr_us, "gbps": gbps,
                                          "pct_copy": 100 * gbps / copy_gbps, "graph": name in graphed,
                                          "reps": t.reps, **({"note": notes[name]} if name in notes else {})}
            else:
                row["providers"][name].setdefault("repeat_us", []).append(t.median_us)
    del inputs
    torch.cuda.empty_cache()
    return row


def row_copy(nbytes: int) -> Callable[[], Any]:
    """A device-to-device copy of nbytes / 2 (so nbytes read and written), timed like a provider. Small copies do
    not reach the bandwidth of the 1 GiB copy behind % copy; this one says what a kernel moving the row's bytes
    can reach at the row's own size."""
    import torch
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def graph_where_short(timer: measure.Timer, fns: Mapping[str, Callable[[], Any]]) -> tuple[dict, set]:
    """Providers whose launch is shorter than the policy's threshold, captured as CUDA graphs where possible."""
    out, graphed = dict(fns), set()
    for name, fn in fns.items():
        if timer.estimate_us(fn) < timer.policy.graph_below_us:
            replay = timer.graphed([fn])
            if replay is not None:
                out[name] = replay[0]
                graphed.add(name)
    return out, graphed


def run(problem_name: str, subject_spec: Mapping[str, str], shapes: str, dtypes: Sequence[str],
        baselines: Sequence[str] | None, reps: int, repeat: int, graph_below_us: float,
        on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Time the subject and the baselines on every case. After each case, on_row (if given) gets the result so
    far, marked `partial` ("K of N cases"), so that a bench cut short still leaves what it measured."""
    import torch
    problem = registry.load("problem", problem_name)
    from ..evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        raise ConfigError(f"bench needs an NVIDIA GPU ({reason}); on this machine, re-render a recorded result "
                          f"with `kernel-factory bench --from BENCH.json`")
    subject = make_subject(problem, subject_spec)
    cases = parse_cases(problem, shapes, dtypes)
    wanted = check_baselines(problem, baselines, subject.genes_for is None)
    stream_t = torch.cuda.Stream()
    torch.cuda.set_stream(stream_t)
    stream = launcher.torch_stream()
    timer = measure.Timer(measure.TimingPolicy(warmup=3, graph_below_us=graph_below_us))
    before = measure.clocks()
    copy = measure.copy_bandwidth_gbps(timer)
    started = time.perf_counter()
    fp = measure.fingerprint({"clocks_before": before, "copy_gbps": f"{copy:.0f}"})

    def result(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = {"format": "kernel-factory-bench/1", "problem": problem.name, "subject": subject.label,
               "baselines": wanted, "peers": published_peers(problem, wanted), "reps": reps, "repeat": repeat,
               "graph_below_us": graph_below_us, "copy_gbps": copy, "wall_s": time.perf_counter() - started,
               "fingerprint": {**fp, "clocks_after": measure.clocks()}, "rows": list(rows)}
        if len(rows) < len(cases):
            out["partial"] = f"{len(rows)} of {len(cases)} cases"
        return out
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        compiled = Compiled(problem, tmp)
        try:
            for c in cases:
                rows.append(bench_case(problem, subject, compiled, timer, stream, c, wanted, reps, repeat, copy))
                if on_row is not None and len(rows) < len(cases):
                    on_row(result(rows))
        finally:
            compiled.compiler.close()
    return result(rows)


def check_baselines(problem: Problem, baselines: Sequence[str] | None, subject_is_op: bool) -> list[str]:
    """The baselines to time: those asked for (None: all of the problem's), less the op when it is the subject
    (it cannot be its own baseline); an unknown name is an error that lists the valid ones."""
    own = "factory_op" if subject_is_op else None
    wanted = [b for b in (baselines if baselines is not None else problem.baselines) if b != own]
    unknown = [b for b in wanted if b not in problem.baselines]
    if unknown:
        raise ConfigError(f"--baselines: {problem.name} has no baseline {unknown[0]!r}; it has "
                          f"{', '.join(problem.baselines)}")
    return wanted


def published_peers(problem: Problem, baselines: Sequence[str]) -> list[str]:
    """Those of the baselines that the problem names as its published peers (`peers`, the kernels its targets are
    set against); every baseline when it names none or none of them was benched."""
    peers = problem.peers if isinstance(problem, PublishedPeers) else ()
    return [b for b in peers if b in baselines] or list(baselines)


def make_subject(problem: Problem, spec: Mapping[str, str]) -> Subject:
    """From exactly one of: genes (JSON), run (its best candidate), table (a dispatch table), op (the library op)."""
    given = {k: v for k, v in spec.items() if v}
    if len(given) != 1:
        raise ConfigError("bench needs exactly one subject: --genes JSON, --run RUN_ID, --table FILE or --op")
    kind, value = next(iter(given.items()))
    if kind == "op":
        return Subject(f"library op ({problem.name})", None)
    if kind == "table":
        from . import dispatch
        table = dispatch.load(value)
        def genes_for(case: Case) -> Mapping[str, GeneValue]:
            found = dispatch.lookup(table, case.dtype, case.shape[-1], case.shape[0])
            if found is None:
                raise ConfigError(f"--table {value!r} has no entry for {case.dtype}")
            return {**problem.space.defaults(), **found[0].gene_dict}
        return Subject(f"dispatch table {value}", genes_for)
    if kind == "run":
        genes = run_best_genes(value, problem)
        return Subject(f"best of run {value}", lambda case: genes)
    try:
        genes = {**problem.space.defaults(), **json.loads(value)}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--genes is not JSON: {exc}") from None
    why = problem.space.why_infeasible(genes)
    if why:
        raise ConfigError(f"--genes: {why}")
    return Subject(f"genome {Genome.of(genes).id}", lambda case: genes)


def run_best_genes(spec: str, problem: Problem) -> Mapping[str, GeneValue]:
    from .. import journal
    path = Path(spec) if Path(spec).is_file() else Path("runs") / spec / journal.NAME
    if not path.is_file():
        raise ConfigError(f"--run {spec!r}: no journal at {path}")
    run = journal.read(path)
    best = run.end.best if run.end else None
    for cand, _ in run.pairs():
        if cand.id == best:
            genome = cand.genome
            if genome.patch:
                raise ConfigError(f"--run {spec!r}: its best candidate carries a code patch; bench takes genes only")
            return {**problem.space.defaults(), **genome.gene_dict}
    raise ConfigError(f"--run {spec!r}: the journal names no best candidate (did the run finish?)")
