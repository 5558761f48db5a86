"""The GPU worker: a spawned process that owns the CUDA context, loads cubins, checks every candidate on fresh
inputs and only then times it. A faulting kernel poisons the context, so after a fatal error the worker reports
the candidate as crashed and exits; the parent (gpu.py) restarts it.

Messages over a multiprocessing Pipe, all plain dicts:
  parent -> worker: {"op": "setup", ...}, {"op": "eval", ...}, {"op": "stop"}
  worker -> parent: {"op": "ready", ...}, {"op": "result", ...}
"""
from __future__ import annotations

import random
import time
import traceback
from typing import Any, Mapping, Sequence

from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import launcher, measure
from kernel_factory.evo.protocols import Launch, Problem
from kernel_factory.evo.types import Case, Status

# CUDA errors after which the context cannot be trusted (CUDA's "sticky" errors).
FATAL_MARKERS = ("ILLEGAL_ADDRESS", "illegal memory access", "MISALIGNED", "misaligned address", "LAUNCH_FAILED",
                 "unspecified launch failure", "ILLEGAL_INSTRUCTION", "illegal instruction", "HARDWARE_STACK_ERROR",
                 "ASSERT", "device-side assert", "LAUNCH_TIMEOUT", "unknown error")
BENCH_SAMPLE_ROWS = 256   # rows of each benchmark output re-checked after timing


class Fatal(Exception):
    """The CUDA context is poisoned: report, then exit so the parent can restart a clean worker."""


class LaunchRejected(Exception):
    """The driver refused the launch (e.g. too many resources); the context is still good."""


class Bench:
    """Per-process state: the problem, the CUDA stream, benchmark inputs (allocated once) and the timer."""

    def __init__(self, setup: Mapping[str, Any]):
        import torch
        from cuda.core import Device, Stream
        self.torch = torch
        self.problem: Problem = registry.load("problem", setup["problem"])
        torch.cuda.init()
        self.stream_t = torch.cuda.Stream()
        torch.cuda.set_stream(self.stream_t)
        Device(0).set_current()
        self.stream = Stream.from_handle(self.stream_t.cuda_stream)
        self.timer = measure.Timer(measure.TimingPolicy(**setup.get("timing", {})))
        self.bench_cases = [Case.parse(k) for k in setup["bench_cases"]]
        self.check_cases = [Case.parse(k) for k in setup["check_cases"]]
        self.check_seeds = int(setup.get("check_seeds", 2))
        self.baseline = setup["baseline"]
        self._bench_io: dict[str, tuple[dict, dict]] = {}

    def bench_io(self, case: Case) -> tuple[dict, dict]:
        """Inputs and outputs of a benchmark case, made once per worker (inputs from a fixed seed)."""
        if case.key not in self._bench_io:
            inputs = self.problem.make_inputs(case, seed=12345, device="cuda")
            self._bench_io[case.key] = (inputs, self.problem.make_outputs(case, "cuda"))
        return self._bench_io[case.key]

    def launcher(self, module: launcher.Module, plan: Launch | Sequence[Launch]):
        return launcher.launcher(self.stream, module, plan)

    def sync(self) -> None:
        try:
            self.torch.cuda.synchronize()
        except Exception as exc:
            raise Fatal(f"{type(exc).__name__}: {exc}") from exc

    def poison(self, outputs: Mapping[str, Any]) -> None:
        for t in outputs.values():
            t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)

    def check(self, kernel: Any, genes: Mapping[str, Any], case: Case, seed: int) -> str | None:
        """Fresh inputs, poisoned outputs, one launch, compare every output with the reference."""
        p = self.problem
        inputs = p.make_inputs(case, seed, "cuda")
        outputs = p.make_outputs(case, "cuda")
        ref = p.reference(inputs)
        self.poison(outputs)
        self.sync()
        run(self.launcher(kernel, p.launch(genes, case, inputs, outputs)))
        self.sync()
        atol, rtol = p.tolerance(case.dtype)
        for name, want in ref.items():
            bad = measure.mismatch(outputs[name], want, atol, rtol, f"{case.key} seed {seed} {name}")
            if bad:
                return bad
        return None

    def verify_sample(self, case: Case, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> str | None:
        """Re-check a random sample of rows of a benchmark output produced by the timed launches.

        Assumes a row-wise problem (each output row depends only on the same input row, and tensors whose first
        dimension is M are split by rows), which holds for the shipped problems."""
        torch, p = self.torch, self.problem
        m = case.shape[0]
        rows = sorted(set(random.Random(case.key).sample(range(m), min(m, BENCH_SAMPLE_ROWS)) + [0, m - 1]))
        idx = torch.tensor(rows, device="cuda")
        sub_inputs = {k: (v.index_select(0, idx) if v.dim() > 1 and v.shape[0] == m else v) for k, v in inputs.items()}
        ref = p.reference(sub_inputs)
        atol, rtol = p.tolerance(case.dtype)
        for name, want in ref.items():
            bad = measure.mismatch(outputs[name].index_select(0, idx), want, atol, rtol, f"{case.key} timed {name}")
            if bad:
                return bad
        return None

    def baseline_times(self) -> dict[str, float]:
        out = {}
        for case in self.bench_cases:
            inputs, _ = self.bench_io(case)
            fn = self.problem.baseline(self.baseline, case, inputs)
            out[case.key] = self.timer.time(fn).median_us
        return out

    def evaluate(self, req: Mapping[str, Any]) -> dict[str, Any]:
        p = self.problem
        genes = req["genes"]
        kernels = {dt: launcher.Module(cubin, p.kernel_name) for dt, cubin in req["cubins"].items()}
        rng = random.Random(req["seed"])
        for case in self.check_cases:
            for _ in range(self.check_seeds):
                bad = self.check(kernels[case.dtype], genes, case, rng.randrange(2**31))
                if bad:
                    return {"status": Status.INCORRECT.value, "message": bad}
        times, iqrs = {}, {}
        for case in self.bench_cases:
            inputs, outputs = self.bench_io(case)
            fn = self.launcher(kernels[case.dtype], p.launch(genes, case, inputs, outputs))
            self.poison(outputs)
            timing = run_timed(self.timer, fn)
            self.sync()
            bad = self.verify_sample(case, inputs, outputs)
            if bad:
                return {"status": Status.INCORRECT.value, "message": bad}
            times[case.key], iqrs[case.key] = timing.median_us, timing.iqr_us
        return {"status": Status.OK.value, "times_us": times, "iqr_us": iqrs, "message": ""}


def run(fn) -> None:
    try:
        fn()
    except Exception as exc:
        text = f"launch failed: {type(exc).__name__}: {exc}"
        raise (Fatal if is_fatal(text) else LaunchRejected)(text) from exc


def is_fatal(text: str) -> bool:
    return any(marker in text for marker in FATAL_MARKERS)


def run_timed(timer: measure.Timer, fn) -> measure.Timing:
    try:
        return timer.time(fn)
    except Exception as exc:
        raise Fatal(f"{type(exc).__name__}: {exc}") from exc


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
            try:
                bench = Bench(msg)
                for case in bench.bench_cases:
                    bench.bench_io(case)
                before = measure.clocks()
                copy = measure.copy_bandwidth_gbps(bench.timer)
                baseline = msg.get("baseline_us") or bench.baseline_times()
                conn.send({"op": "ready", "baseline_us": baseline, "copy_gbps": copy,
                           "fingerprint": measure.fingerprint({"clocks_at_setup": before})})
            except Exception:
                conn.send({"op": "error", "message": traceback.format_exc()[-4000:]})
                return
            continue
        start = time.perf_counter()
        try:
            reply = bench.evaluate(msg)
            fatal = False
        except Fatal as exc:
            reply, fatal = {"status": Status.CRASHED.value, "message": str(exc)[:2000]}, True
        except Exception as exc:  # LaunchRejected, a cubin that does not load, ...
            text = f"{type(exc).__name__}: {exc}"
            fatal = is_fatal(text)
            reply = {"status": Status.CRASHED.value, "message": text[:2000]}
        reply.update(op="result", id=msg["id"], gpu_s=time.perf_counter() - start, fatal=fatal)
        conn.send(reply)
        if fatal:
            return
