"""The GPU worker: a spawned process that owns the CUDA context, loads cubins, gates every candidate on fresh
inputs (gate.py) and only then times it. A faulting kernel poisons the context, so after a fatal error the worker
reports the candidate as crashed and exits; the parent (gpu.py) restarts it, and every start (first or restart)
must pass a known-good kernel through the full gate before it answers anything.

Messages over a multiprocessing Pipe, all plain dicts:
  parent -> worker: {"op": "setup", ...}, {"op": "eval", ...} (racing: "cases", "gate"), {"op": "retime", ...},
                    {"op": "stop"}
  worker -> parent: {"op": "ready", ...}, {"op": "error", ...}, {"op": "result", ...}
"""
from __future__ import annotations

import dataclasses
import random
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

from .. import registry
from . import fingerprint, gate, launcher, measure
from .bench_pools import Pool, Pools, SetupError, allocate_pools, checksum
from .paired import PairedBaselines
from ..protocols import Launch, Problem, RowReference
from ..types import Case, Status

# CUDA errors after which the context cannot be trusted (CUDA's "sticky" errors).
FATAL_MARKERS = ("ILLEGAL_ADDRESS", "illegal memory access", "MISALIGNED", "misaligned address", "LAUNCH_FAILED",
                 "unspecified launch failure", "ILLEGAL_INSTRUCTION", "illegal instruction", "HARDWARE_STACK_ERROR",
                 "ASSERT", "device-side assert", "LAUNCH_TIMEOUT", "unknown error", "TRAP", "trap")
BENCH_SAMPLE_ROWS = 256     # rows of each benchmark output re-checked after timing
ROOFLINE_SLACK = 1.05       # faster than bytes / (1.05 x measured copy bandwidth) is physically suspect


class Fatal(Exception):
    """The CUDA context is poisoned: report, then exit so the parent can restart a clean worker."""


class Rejected(Exception):
    """A failure that is the candidate's fault and leaves the context usable (wrong answer, launch refused)."""

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


class Bench:
    """Per-process state: the problem, the CUDA stream, benchmark pools (allocated once) and the timer."""

    def __init__(self, setup: Mapping[str, Any]):
        import torch
        self.torch = torch
        self.problem: Problem = registry.load("problem", setup["problem"])
        torch.cuda.init()
        self.stream_t = torch.cuda.Stream()
        torch.cuda.set_stream(self.stream_t)
        self.stream = launcher.torch_stream()
        self.timer = measure.Timer(measure.TimingPolicy(**setup.get("timing", {})))
        self.bench_cases = [Case.parse(k) for k in setup["bench_cases"]]
        self.check_cases = [Case.parse(k) for k in setup["check_cases"]]
        self.baseline = setup["baseline"]
        self.check_seeds = int(setup.get("check_seeds", 2))
        self.pools = Pools(lambda case: Pool(self.problem, case), release_memory)
        self.copy_gbps = 0.0
        # The baseline: measured at setup and again every baseline_every_s seconds while candidates run (clocks and
        # temperature drift: a baseline timed once, on a GPU that had sat idle through a compile, flattered every
        # candidate after it). Each case is timed one way, as CUDA-graph replays or eagerly, decided once from the
        # baseline's measurement at setup and kept for its re-timings and every candidate: a decision taken again
        # from one noisy estimate each time flipped a torch.compile baseline between graph and host-bound timing
        # (6.7x apart) within one run.
        self.baseline_every_s = float(setup.get("baseline_every_s", 0.0))
        self.baseline_us: dict[str, float] = {}
        self.baseline_at = 0.0
        self.graph_mode: dict[str, bool] = dict(setup.get("graph_mode", {}))
        self.paired = bool(setup.get("paired", False))   # each candidate timed interleaved with the baseline
        self.paired_guard = PairedBaselines()   # a paired baseline far from its usual time is timed again
        self.host_bound: set[str] = set()   # rows whose baseline's host path outlasted the flush (its time may leak)

    def pool(self, case: Case) -> Pool:
        return self.pools.get(case)

    def prepare(self, module: launcher.Module, genes: Mapping[str, Any], case: Case, inputs: Mapping[str, Any],
                outputs: Mapping[str, Any]):
        plan: Launch | Sequence[Launch] = self.problem.launch(genes, case, inputs, outputs)
        try:
            return launcher.launcher(self.stream, module, plan)
        except Exception as exc:  # a kernel name missing from the cubin, shared memory that cannot be allowed
            raise classify(f"cannot prepare the launch: {type(exc).__name__}: {exc}") from exc

    def sync(self) -> None:
        try:
            self.torch.cuda.synchronize()
        except Exception as exc:
            raise Fatal(f"{type(exc).__name__}: {exc}") from exc

    def gate_case(self, module: launcher.Module, genes: Mapping[str, Any], case: Case, rng: random.Random) -> None:
        def run_and_sync(inputs, outputs):
            self.sync()
            run(self.prepare(module, genes, case, inputs, outputs))
            self.sync()
        bad = gate.Gate(self.problem, run_and_sync, seeds=self.check_seeds).check(case, rng)
        if bad:
            raise Rejected(Status.INCORRECT, bad)

    def verify_sample(self, case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any], label: str,
                      rng: random.Random) -> None:
        """Re-check a random sample of rows of a benchmark output against the inputs that produced it.

        Row-wise problems by default: each output row depends only on the same input row, and tensors whose first
        dimension is M are split by rows. A problem with outputs that reduce over rows (a backward's dw) provides
        reference_rows(inputs, rows) and names its row-split outputs in row_outputs; the others are compared whole."""
        torch, p = self.torch, self.problem
        m = case.shape[0]
        rows = gate.sample_rows(m, rng, BENCH_SAMPLE_ROWS)   # fresh per candidate: first, last, a stripe, random
        idx = torch.tensor(rows, device="cuda")
        if isinstance(p, RowReference):
            ref, by_rows = p.reference_rows(inputs, idx), set(p.row_outputs)
        else:
            pick = {k: (v.index_select(0, idx) if getattr(v, "dim", lambda: 0)() > 1 and v.shape[0] == m else v)
                    for k, v in inputs.items()}
            ref = p.reference(pick)
            by_rows = {k for k in ref if outputs[k].shape[:1] == (m,)}
        for name, want in ref.items():
            got = outputs[name].index_select(0, idx) if name in by_rows else outputs[name]
            atol, rtol = measure.tolerance_of(p, name, case.dtype)
            bad = measure.mismatch(got, want, atol, rtol, f"{case.key} {label} {name}")
            if bad:
                raise Rejected(Status.INCORRECT, bad)

    def time_case(self, module: launcher.Module, genes: Mapping[str, Any], case: Case,
                  rng: random.Random) -> measure.Timing:
        """Rotate through the input sets while timing; then verify the timed output, call once more on the same
        buffers after poisoning (stale results fail), and check canaries and input checksums."""
        pool = self.pool(case)
        fns = [self.prepare(module, genes, case, inputs, pool.guarded.views) for inputs in pool.inputs]
        gate.poison(pool.guarded.views)
        timing = run_timed(self.timer, fns, graphs=self.graph_mode.get(case.key))
        self.sync()
        self.check_timed(case, pool, fns, timing.last, rng)
        return timing

    def time_case_paired(self, module: launcher.Module, genes: Mapping[str, Any], case: Case,
                         rng: random.Random) -> tuple[measure.Timing, measure.Timing]:
        """time_case with the baseline interleaved sample by sample (each rotating over the input sets, each after
        its own flush, the case's way: graphs or eager); the same checks after. (candidate, baseline)"""
        pool = self.pool(case)
        fns = [self.prepare(module, genes, case, inputs, pool.guarded.views) for inputs in pool.inputs]
        gate.poison(pool.guarded.views)
        try:
            base = [self.problem.baseline(self.baseline, case, inputs) for inputs in pool.inputs]
            calls, refs = self.paired_calls(case, fns, base)
            cand, ref = Rotation(calls), Rotation(refs)
            reps = self.timer.reps_for(self.timer.estimate_us(cand))
            timings = self.timer.time_interleaved([cand, ref], reps)
        except Exception as exc:
            raise Fatal(f"{type(exc).__name__}: {exc}") from exc
        self.sync()
        self.check_timed(case, pool, fns, cand.last, rng)
        graph = calls[0] is not fns[0]   # replays stand in for the launches
        return tuple(dataclasses.replace(t, graph=graph, last=cand.last) for t in timings)

    def check_timed(self, case: Case, pool: Pool, fns: Sequence[Callable[[], Any]], last_set: int,
                    rng: random.Random) -> None:
        """After timing: the output left by the last timed call is right, a repeated call on poisoned buffers is
        right too (stale results fail), and canaries and input checksums are intact."""
        outs = pool.guarded.views
        last = pool.inputs[last_set]
        self.verify_sample(case, last, outs, "timed output", rng)
        gate.poison(outs)
        run(fns[last_set])
        self.sync()
        self.verify_sample(case, last, outs, "repeated call on the same buffers", rng)
        bad = pool.guarded.violations() or next((v for v in map(gate.Guarded.violations, pool.input_guards) if v),
                                                None) or next(
            (f"{case.key}: benchmark input {k!r} was modified" for i, inp in enumerate(pool.inputs)
             for k, v in checksum(inp).items() if v != pool.checksums[i][k]), None)
        if bad:
            raise Rejected(Status.INCORRECT, f"{case.key}: {bad}" if not bad.startswith(case.key) else bad)

    def floor_us(self, case: Case) -> float:
        return self.problem.bytes_moved(case) / (ROOFLINE_SLACK * self.copy_gbps * 1e9) * 1e6 if self.copy_gbps else 0

    def roofline_recheck(self, module, genes, case: Case, rng: random.Random) -> measure.Timing:
        """A time under the roofline floor: gate the case itself in full on fresh inputs, then time it again."""
        self.gate_case(module, genes, case, rng)
        timing = self.time_case(module, genes, case, rng)
        if timing.median_us < self.floor_us(case):
            raise Rejected(Status.SUSPECT, f"{case.key}: {timing.median_us:.2f} us is below the roofline floor "
                                           f"{self.floor_us(case):.2f} us (bytes / {ROOFLINE_SLACK} x measured "
                                           f"copy {self.copy_gbps:.0f} GB/s) after a full re-check; not reported")
        return timing

    def evaluate(self, req: Mapping[str, Any]) -> dict[str, Any]:
        genes = req["genes"]
        modules = {dt: launcher.Module(cubin, self.problem.kernel_name) for dt, cubin in req["cubins"].items()}
        rng = random.Random(req["seed"])
        # Racing (evaluate/racing.py): "cases" times only those benchmark cases; "gate": false skips the gate for a
        # second leg of the same binaries, which passed it in the first.
        timed = [c for c in self.bench_cases if "cases" not in req or c.key in req["cases"]]
        try:
            for case in self.check_cases if req.get("gate", True) else ():
                self.gate_case(modules[case.dtype], genes, case, rng)
            if req.get("check_only"):
                return {"status": Status.OK.value, "message": "passed the gate (not timed)"}
            times, iqrs, graphs, paired = {}, {}, [], {}
            self.paired_guard.take_evidence()   # a rejected candidate's retries are not the next one's
            for case in timed:
                if self.paired:
                    timing, ref = self.paired_guard.vetted(
                        case.key, lambda: self.time_case_paired(modules[case.dtype], genes, case, rng),
                        self.baseline_us.get(case.key))
                    paired[case.key] = ref.median_us
                else:
                    timing = self.time_case(modules[case.dtype], genes, case, rng)
                if timing.median_us < self.floor_us(case):
                    timing = self.roofline_recheck(modules[case.dtype], genes, case, rng)
                times[case.key], iqrs[case.key] = timing.median_us, timing.iqr_us
                graphs += [case.key] if timing.graph else []
        except Rejected as exc:
            return {"status": exc.status.value, "message": str(exc)[:4000]}
        out = {"status": Status.OK.value, "times_us": times, "iqr_us": iqrs, "graph_cases": graphs, "message": ""}
        if not self.paired:
            return out
        return {**out, "paired_baseline_us": paired, "paired_retimed": self.paired_guard.take_evidence()}

    def retime(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """A finalist: candidate and baseline interleaved sample by sample, with many repetitions, per case."""
        genes, reps = req["genes"], int(req.get("reps", 100))
        rng = random.Random(f"{req['id']}:{time.time_ns()}")   # the re-check's rows: fresh for every re-timing
        modules = {dt: launcher.Module(cubin, self.problem.kernel_name) for dt, cubin in req["cubins"].items()}
        out: dict[str, dict[str, float]] = {"times_us": {}, "iqr_us": {}, "baseline_us": {}, "baseline_iqr_us": {}}
        try:
            for case in self.bench_cases:
                pool = self.pool(case)
                fn = self.prepare(modules[case.dtype], genes, case, pool.inputs[0], pool.guarded.views)
                base = self.problem.baseline(self.baseline, case, pool.inputs[0])
                gate.poison(pool.guarded.views)
                try:   # timed the case's way, as in the search: host time must not leak into either
                    cand, ref = self.timer.time_interleaved(sum(self.paired_calls(case, [fn], [base]), []), reps)
                except Exception as exc:
                    raise Fatal(f"{type(exc).__name__}: {exc}") from exc
                self.sync()
                self.verify_sample(case, pool.inputs[0], pool.guarded.views, "re-timed output", rng)
                out["times_us"][case.key], out["iqr_us"][case.key] = cand.median_us, cand.iqr_us
                out["baseline_us"][case.key], out["baseline_iqr_us"][case.key] = ref.median_us, ref.iqr_us
        except Rejected as exc:
            return {"status": exc.status.value, "message": str(exc)[:4000]}
        return {"status": Status.OK.value, "message": "", "reps": reps, **out}

    def time_baseline(self) -> dict[str, float]:
        """Each benchmark case's baseline timed as a candidate is: the same timer (warm-up, an L2 flush before every
        sample, repetitions), rotating over the case's input sets, under the same graph rule."""
        out = {}
        for case in self.bench_cases:
            try:
                fns = [self.problem.baseline(self.baseline, case, inputs) for inputs in self.pool(case).inputs]
                mode = self.graph_mode.get(case.key)
                timing = run_timed(self.timer, fns, graphs=self.timer.is_short(fns[0]) if mode is None else mode)
            except Exception as exc:   # a peer that refuses a shape (Liger past N = 65536), or is not installed
                cause = exc.__cause__ or exc
                raise SetupError(f"the baseline {self.baseline!r} cannot run {case.key}: "
                                 f"{type(cause).__name__}: {cause}"[:1000]) from exc
            self.graph_mode[case.key] = timing.graph
            if not timing.graph and timing.host_us > self.timer.flush_us() + timing.hold_us + timing.median_us:
                self.host_bound.add(case.key)
            out[case.key] = timing.median_us
        self.baseline_us, self.baseline_at = out, time.perf_counter()
        return out

    def paired_calls(self, case: Case, fns: Sequence[Callable[[], Any]], base: Sequence[Callable[[], Any]]
                     ) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]]]:
        """A candidate's calls and the baseline's, as CUDA-graph replays where the case is graph-timed (all eager if
        any cannot be captured)."""
        mode = self.graph_mode.get(case.key)
        both = [*fns, *base]
        if mode is None:
            both = self.timer.graphed_together(both)[0]
        elif mode:
            both = self.timer.graphed(both) or both
        return both[:len(fns)], both[len(fns):]

    def baseline_due(self) -> bool:
        return self.baseline_every_s > 0 and time.perf_counter() - self.baseline_at >= self.baseline_every_s

    def retime_baseline(self) -> dict[str, Any]:
        """The baseline measured again between candidates; the reply's fields say what it found and cost. A failure
        keeps the last measurement and says why."""
        begin = time.perf_counter()
        try:
            fresh = self.time_baseline()
        except Exception as exc:
            self.baseline_at = time.perf_counter()   # not again before the next interval
            return {"baseline_error": f"{type(exc).__name__}: {exc}"[:500]}
        return {"baseline_retimed_us": fresh, "baseline_gpu_s": time.perf_counter() - begin,
                "baseline_host_bound": sorted(self.host_bound)}


class Rotation:
    """One callable that calls the next of several on each call (the input sets in turn); `last` says which ran
    last, so that its output can be checked."""

    def __init__(self, calls: Sequence[Callable[[], Any]]):
        self.calls, self.last = list(calls), -1

    def __call__(self) -> Any:
        self.last = (self.last + 1) % len(self.calls)
        return self.calls[self.last]()


def classify(text: str) -> Exception:
    return Fatal(text) if is_fatal(text) else Rejected(Status.CRASHED, text)


def run(fn) -> None:
    try:
        fn()
    except Exception as exc:
        raise classify(f"launch failed: {type(exc).__name__}: {exc}") from exc


def is_fatal(text: str) -> bool:
    return any(marker in text for marker in FATAL_MARKERS)


def run_timed(timer: measure.Timer, fns, graphs: bool = True) -> measure.Timing:
    try:
        return timer.time(fns, graphs)
    except Exception as exc:
        raise Fatal(f"{type(exc).__name__}: {exc}") from exc


def start(msg: Mapping[str, Any]) -> tuple[Bench, dict[str, Any]]:
    """Set up, measure copy bandwidth and the baseline, then prove the setup with a known-good kernel."""
    bench = Bench(msg)
    allocate_pools(bench.pools, bench.bench_cases, bench.torch.cuda.get_device_properties(0).total_memory)
    before = fingerprint.clocks()
    bench.copy_gbps = msg.get("copy_gbps") or measure.copy_bandwidth_gbps(bench.timer)
    if msg.get("baseline_us"):   # a restart: the last measurement of the worker it replaces
        bench.baseline_us, bench.baseline_at = dict(msg["baseline_us"]), time.perf_counter()
    else:
        bench.time_baseline()   # a first pass compiles (torch.compile, Triton), autotunes and brings the clocks up
        bench.graph_mode.clear()   # so each case's way of timing is decided without compile time in its estimates
        bench.time_baseline()   # the measurement
    good = msg.get("known_good")
    if good:
        reply = bench.evaluate({**good, "check_only": True, "seed": random.randrange(2**31)})
        if reply["status"] != Status.OK.value:
            raise RuntimeError(f"the known-good kernel failed the gate on this worker: {reply['message']}")
    return bench, {"op": "ready", "baseline_us": bench.baseline_us, "graph_mode": bench.graph_mode,
                   "baseline_host_bound": sorted(bench.host_bound),
                   "copy_gbps": bench.copy_gbps, "fingerprint": fingerprint.fingerprint({"clocks_at_setup": before})}


def release_memory() -> None:
    """Return what freed tensors held to the driver (the caching allocator keeps it otherwise)."""
    import gc
    import torch
    gc.collect()
    torch.cuda.empty_cache()


def serve(conn) -> None:
    """Worker main loop: answer one message at a time until told to stop or the context is poisoned."""
    bench: Bench | None = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg["op"] == "stop":
            return
        if msg["op"] == "setup":
            if bench is not None:   # a parked worker taken over: free the last run's input pools before the new
                bench = None        # ones are made (both at once need twice the memory; a campaign ran out of it)
                release_memory()
            try:
                bench, ready = start(msg)
                conn.send(ready)
            except SetupError as exc:
                conn.send({"op": "error", "message": str(exc)})
                return
            except Exception:
                conn.send({"op": "error", "message": traceback.format_exc()[-4000:]})
                return
            continue
        extra = bench.retime_baseline() if msg["op"] == "eval" and bench.baseline_due() else {}
        begin = time.perf_counter()
        fatal = False
        try:
            reply = bench.retime(msg) if msg["op"] == "retime" else bench.evaluate(msg)
        except Fatal as exc:
            reply, fatal = {"status": Status.CRASHED.value, "message": str(exc)[:2000]}, True
        except Exception as exc:  # a cubin that does not load, ...
            text = f"{type(exc).__name__}: {exc}"
            fatal = is_fatal(text)
            reply = {"status": Status.CRASHED.value, "message": text[:2000]}
        reply.update(op="result", id=msg["id"], gpu_s=time.perf_counter() - begin, fatal=fatal, **extra)
        if msg["op"] == "eval":
            reply["baseline_us"] = bench.baseline_us   # the fitness is taken against the latest measurement
        conn.send(reply)
        if fatal:
            return
