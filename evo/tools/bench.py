"""`kernel-factory bench`: one kernel against its peers, side by side in one process on one GPU.

The problem declares its peers (tools/peers.py); every one must load, or the command says which cannot and why and
stops before anything is timed, unless it is left out by name (`--without`), which every headline then says. Every
provider (the subject and each baseline) is first checked against the fp32 reference on the row's inputs: the
subject must pass the problem's tolerance; a baseline outside it is still timed and the row notes how far off it is
(a peer that accumulates in bf16, say), while one that fails on the row is recorded without a time. A provider that
crashes (a CUDA error that poisons the context) is recorded as crashed on that row, and the bench goes on from that
row in a fresh process (bench_process.py) without it there. Then all are timed interleaved sample by sample (A B C A
B C ..., an L2 flush before each sample), so that clock or thermal drift falls on all alike. On a row where any launch
is shorter than --graph-below-us, every provider is timed as CUDA-graph replays where it can be captured, and the row
says so; a time taken eagerly beside our graph replay counts only where it is faster even so (peers.comparable). `--repeat
2` times the subject a second time in a separate pass and reports how far the two medians of each row are apart.
Results: a table (worst rows first), CSV, JSON and a PNG, each with the environment fingerprint (bench_report.py
renders them; `--from` re-renders a recorded JSON on a machine without a GPU).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import registry
from ..build import shapes_of
from ..config import ConfigError
from ..evaluate import fingerprint, gate, launcher, measure, render
from ..evaluate.compile import CompileJob, Compiler
from ..protocols import MissingBaseline, Problem
from ..types import Candidate, Case, Genome, GeneValue
from . import peers
from .peers import COPY, SUBJECT  # noqa: F401  (re-exported: tools and tests read them here)


class Crashed(Exception):
    """A provider poisoned the CUDA context on a case: nothing more can run in this process."""

    def __init__(self, case: str, provider: str, why: str):
        super().__init__(f"{provider} crashed on {case}: {why}")
        self.case, self.provider, self.why = case, provider, why


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
    """name -> zero-argument callable returning the outputs, or a string saying why it is unavailable. Each setup
    is synchronized (some run the peer: an autotuner, a forward pass), so that a crash is charged to its maker."""
    import torch
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
            torch.cuda.synchronize()
        except MissingBaseline as exc:
            out[name] = f"unavailable: {exc}" if context_alive() else f"crashed: {exc}"
        except Exception as exc:  # a peer whose setup rejects this shape (e.g. a block size limit)
            out[name] = failure(exc)
        if str(out[name]).startswith("crashed"):
            break   # nothing more can run here; the row is done again in a fresh process without it
    return out


def failure(exc: BaseException) -> str:
    """A provider's exception as a row's error: "crashed: ..." when it left the CUDA context unusable (asked of the
    context itself, not read from the message), else "failed: ..."."""
    why = f"{type(exc).__name__}: {peers.first_line(exc)}"
    return f"failed: {why}" if context_alive() else f"crashed: {why}"


def context_alive() -> bool:
    """Whether this process can still run CUDA work. Tried twice: an ordinary error that the failed call left
    pending surfaces once and is cleared (so it no longer fails the next provider); a sticky one fails every time."""
    import torch
    for _ in range(2):
        try:
            torch.cuda.synchronize()
            if torch.ones(1, device="cuda").add_(1).item() == 2.0:
                return True
        except Exception:
            continue
    return False


def check(problem: Problem, case: Case, inputs: Mapping[str, Any], fn: Callable[[], Mapping[str, Any]]) -> str | None:
    """None if the provider's outputs match the reference on these inputs (only the outputs it returns)."""
    import torch
    try:
        got = fn()
        torch.cuda.synchronize()
    except Exception as exc:  # a baseline that fails on this shape (e.g. an autotuner config that cannot launch)
        return failure(exc)
    ref = problem.reference(inputs)
    for name, want in ref.items():
        if name in got:
            bad = measure.mismatch(got[name], want, *measure.tolerance_of(problem, name, case.dtype), name)
            if bad:
                return f"incorrect: {bad}"
    return None


def bench_case(problem: Problem, subject: Subject, compiled: Compiled, timer: measure.Timer, stream: Any,
               case: Case, baselines: Sequence[str], reps: int, repeat: int, copy_gbps: float,
               skip: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One row: every provider checked, then timed side by side. `skip`: providers that crashed on this case in an
    earlier process (recorded, not run again). Raises Crashed when a provider poisons the context here."""
    import torch
    skip = skip or {}
    row: dict[str, Any] = {"case": case.key, "dtype": case.dtype, "shape": list(case.shape),
                           "bytes": problem.bytes_moved(case), "providers": {},
                           "host_load": round(os.getloadavg()[0], 2)}   # a busy host lengthens the host paths
    if "*" in skip:   # the row crashed where no one provider can be blamed (while timing): recorded, not timed
        row["crashed"] = skip["*"]
        return row
    inputs = problem.make_inputs(case, seed=2026, device="cuda")
    fns = providers(problem, subject, compiled, stream, case, inputs, [b for b in baselines if b not in skip])
    for name, fn in fns.items():
        if isinstance(fn, str) and fn.startswith("crashed"):
            raise Crashed(case.key, name, fn)
    ready: dict[str, Callable[[], Any]] = {}
    notes: dict[str, str] = {}
    for name in [SUBJECT, *baselines]:
        if name in skip:
            row["providers"][name] = {"error": skip[name], "crashed": True}
            continue
        fn = fns[name]
        why = fn if isinstance(fn, str) else check(problem, case, inputs, fn)
        if why and why.startswith("crashed"):
            raise Crashed(case.key, name, why)
        if why and (name == SUBJECT or not why.startswith("incorrect")):
            row["providers"][name] = {"error": why}
            continue
        if why:   # a peer outside our tolerance (e.g. bf16 accumulation) is still timed, and the row says so
            notes[name] = why
        ready[name] = fn
    ready[COPY] = row_copy(row["bytes"])
    free, _ = torch.cuda.mem_get_info()
    row["gpu_free_gib"] = round(free / 2**30, 2)   # what this process and any other leave free as timing starts
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    try:
        timed, graphed = graph_where_short(timer, ready)
        for rep in range(max(1, repeat) if SUBJECT in timed else 1):
            names = list(timed) if rep == 0 else [SUBJECT]
            for name, t in zip(names, timer.time_interleaved([timed[n] for n in names], reps)):
                if rep == 0:
                    gbps = row["bytes"] / (t.median_us * 1e-6) / 1e9
                    row["providers"][name] = {"us": t.median_us, "iqr_us": t.iqr_us, "gbps": gbps,
                                              "pct_copy": 100 * gbps / copy_gbps, "graph": name in graphed,
                                              "reps": t.reps, "host_us": t.host_us, "hold_us": t.hold_us,
                                              **({"note": notes[name]} if name in notes else {})}
                else:
                    row["providers"][name].setdefault("repeat_us", []).append(t.median_us)
    except Exception as exc:   # interleaved: which provider broke the context cannot be told apart
        why = failure(exc)
        if why.startswith("crashed"):
            raise Crashed(case.key, "*", why) from None
        raise
    # a cudaMalloc that failed and was retried after freeing the cache (GPU memory short): each one synchronizes,
    # and the providers that allocate per call pay it inside their times
    row["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries
    if "us" in row["providers"].get(peers.OWN_OP, {}) and len(case.shape) == 2:
        from ...kernels import runtime   # which kernel the op's time is: its tuned pick, and the table rule's
        ran = runtime.picks(case.dtype, *case.shape).get(problem.name)
        if ran:
            row["providers"][peers.OWN_OP]["kernels"] = ran
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
    """On a row where any provider's launch is shorter than the policy's threshold, every provider captured as a
    CUDA graph where it can be. Each one's own eager estimate decided this once: a peer whose host path (autograd,
    say) outlasted the threshold was timed eagerly, host time and all, beside our graph replay, and the backward's
    held-out rows came out 8 to 31 times in our favour."""
    out, graphed = dict(fns), set()
    if not any(timer.estimate_us(fn) < timer.policy.graph_below_us for fn in fns.values()):
        return out, graphed
    for name, fn in fns.items():
        replay = timer.graphed([fn])
        if replay is not None:
            out[name] = replay[0]
            graphed.add(name)
    return out, graphed


def run(problem_name: str, subject_spec: Mapping[str, str | None], shapes: str, dtypes: Sequence[str],
        baselines: Sequence[str] | None, reps: int, repeat: int, graph_below_us: float,
        on_row: Callable[[dict[str, Any]], None] | None = None, without: Sequence[str] = ()) -> dict[str, Any]:
    """Time the subject and its peers (the problem's declared peers for these shapes, or `baselines`; less
    `without`) on every case, in a child process (a fresh one after a crash). After each case, on_row (if given)
    gets the result so far, marked `partial` ("K of N cases"), so that a bench cut short still leaves what it
    measured. Checked before any GPU work: the problem, subject, cases, baselines, and that every peer loads."""
    problem = registry.load("problem", problem_name)
    subject = make_subject(problem, subject_spec)
    cases = parse_cases(problem, shapes, dtypes)
    peers.parse_without(problem, without)
    from ..evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        raise ConfigError(f"bench needs an NVIDIA GPU ({reason}); on this machine, re-render a recorded result "
                          f"with `kernel-factory bench --from BENCH.json`")
    choice = peers.choose(problem, shapes, baselines, without, subject.genes_for is None)
    head = {"format": "kernel-factory-bench/1", "problem": problem.name, "subject": subject.label,
            "baselines": list(choice.timed), "peers": peers.published(problem, choice.timed),
            "declared": list(choice.declared), "without": dict(choice.without), "labels": dict(choice.labels),
            "reps": reps, "repeat": repeat, "graph_below_us": graph_below_us}
    job = {"problem": problem.name, "subject": dict(subject_spec), "cases": [c.key for c in cases],
           "baselines": list(choice.timed), "reps": reps, "repeat": repeat, "graph_below_us": graph_below_us}
    from . import bench_process

    def with_ran(result: dict[str, Any]) -> dict[str, Any]:   # the record of which peers ran, per dtype
        result["ran"] = {d: list(peers.account(result, d).ran) for d in peers.dtypes_of(result)}
        return result
    return with_ran(bench_process.measure(job, head, child_main, on_row and (lambda r: on_row(with_ran(r)))))


def child_main(conn: Any, job: Mapping[str, Any]) -> None:
    """The bench's child process (bench_process.py spawns it): the timing session, then the job's cases in order,
    each row sent as soon as it is measured; a crash ends it. Only plain data comes in (names, case keys)."""
    try:
        problem = registry.load("problem", job["problem"])
        subject = make_subject(problem, job["subject"])
        timer, stream, copy, head = session(job["graph_below_us"])
        conn.send(("start", head))
        with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
            compiled = Compiled(problem, tmp)
            try:
                for key in job["cases"]:
                    try:
                        row = bench_case(problem, subject, compiled, timer, stream, Case.parse(key),
                                         job["baselines"], job["reps"], job["repeat"], copy, job["skip"].get(key))
                    except Crashed as exc:
                        conn.send(("crashed", exc.case, exc.provider, exc.why))
                        return
                    conn.send(("row", row))
            finally:
                compiled.compiler.close()
        conn.send(("done", {"clocks_after": fingerprint.clocks()}))
    except KeyboardInterrupt:   # Ctrl-C reaches the whole process group: the parent reports what was measured
        conn.send(("interrupted",))
    except ConfigError as exc:
        conn.send(("config_error", str(exc)))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def session(graph_below_us: float) -> tuple[measure.Timer, Any, float, dict[str, Any]]:
    """This process's timing set-up: (timer, launch stream, copy bandwidth, the head's copy and fingerprint)."""
    import torch
    stream_t = torch.cuda.Stream()
    torch.cuda.set_stream(stream_t)
    timer = measure.Timer(measure.TimingPolicy(warmup=3, graph_below_us=graph_below_us))
    before = fingerprint.clocks()
    copy = measure.copy_bandwidth_gbps(timer)
    fp = fingerprint.fingerprint({"clocks_before": before, "copy_gbps": f"{copy:.0f}", **op_tables()})
    return timer, launcher.torch_stream(), copy, {"copy_gbps": copy, "flush_us": timer.flush_us(), "fingerprint": fp}


def op_tables() -> dict[str, str]:
    """op.<problem>: the dispatch table the exported op loads in this process (its path and sha256), so that a bench
    says which table its 'factory_op' rows ran: the installed package's, which a table copied into a checkout beside
    it does not replace."""
    from ...kernels.runtime import OPS_DIR
    return {f"op.{path.stem}": f"{path} sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
            for path in sorted(OPS_DIR.glob("*.json"))}


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
