"""The compile half of `kernel-factory check`: render and NVRTC-compile genomes for sm_90a in every dtype, on a
process pool with progress lines; report ptxas resources, gene values that never compile, and genomes that compile
to the same binary as another (two values of a gene that make one kernel: a stale genes header, a gene the template
ignores, or one that only launch() reads); a compile error comes with the generated source around its line."""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import random
import re
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..evaluate import binary, render
from ..evaluate.compile import ARCH, CompileJob, CompileOutput, compile_one
from ..protocols import Problem
from ..types import Candidate, Genome
from .check_contract import fail

PROGRESS_EVERY_S = 10.0     # at most one progress line this often (and one per tenth of the work)
POOL_FROM = 24              # fewer genomes compile in this process: starting the pool costs more
CONTEXT_LINES = 4           # generated source lines shown before (and half as many after) an error's line


def genomes(prob: Problem, sample: int | None, seed: int) -> list[dict[str, Any]]:
    """The template defaults first, then every other feasible genome (sample None) or a seeded sample of them."""
    every = [g for g in prob.space.enumerate() if prob.space.why_infeasible(g) is None]
    rest = [g for g in every if g != prob.space.defaults()]
    if sample is not None and sample < len(every):
        rest = random.Random(seed).sample(rest, max(0, sample - 1))
    return [prob.space.defaults(), *rest]


def _pooled(pool: cf.Executor, jobs: Sequence[CompileJob]) -> Iterator[CompileOutput]:
    futures = [pool.submit(compile_one, job) for job in jobs]
    try:
        for fut in cf.as_completed(futures):
            yield fut.result()
    finally:
        for fut in futures:
            fut.cancel()


def run_jobs(jobs: Sequence[CompileJob], compile_fn: Callable[[CompileJob], CompileOutput], pool: cf.Executor | None,
             emit: Callable[[str], None], label: str) -> dict[str, CompileOutput]:
    """Every job's output by key, compiled on `pool` (or in this process), with a progress line at most every
    PROGRESS_EVERY_S seconds and at every tenth of the jobs (no more often than once a second)."""
    outputs: Iterable[CompileOutput] = _pooled(pool, jobs) if pool is not None else (compile_fn(j) for j in jobs)
    start = last = time.monotonic()
    step, found = max(1, len(jobs) // 10), {}
    for out in outputs:
        found[out.key] = out
        now, done = time.monotonic(), len(found)
        if done < len(jobs) and len(jobs) >= 20 and (done % step == 0 and now - last >= 1.0
                                                      or now - last >= PROGRESS_EVERY_S):
            rate = done / max(now - start, 1e-9)
            emit(f"compiling {label}: {done}/{len(jobs)} ({rate:.1f}/s, about {(len(jobs) - done) / rate:.0f} s "
                 "left)")
            last = now
    return found


def source_context(source: str, error: str, prob: Problem) -> tuple[str, str]:
    """(the generated source around the first error's line, numbered, the line marked; a hint when that line uses a
    gene's macro as a name), or ("", "") when the log names no line."""
    found = re.search(r"\((\d+)\): (?:catastrophic )?error", error)
    if not found:
        return "", ""
    lines, at = source.splitlines(), int(found.group(1))
    lo, hi = max(1, at - CONTEXT_LINES), min(len(lines), at + CONTEXT_LINES // 2)
    shown = "\n".join(f"{'>>' if i == at else '  '} {i:5d} | {lines[i - 1]}" for i in range(lo, hi + 1))
    used = [g.name for g in prob.space.genes if at <= len(lines)
            and re.search(rf"\b{g.name.upper()}\b", lines[at - 1])]
    hint = ""
    if used and "identifier" in error[found.start():found.start() + 300]:
        hint = (f" (line {at} uses {used[0].upper()}, gene {used[0]!r}'s macro, where a name is expected: rename "
                "the gene or the identifier)")
    return f"generated source around line {at}:\n{shown}", hint


def identical(built: Sequence[tuple[Mapping[str, Any], bytes]]) -> list[list[Mapping[str, Any]]]:
    """Groups of genomes (two or more) whose cubins are the same binary."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for genes, cubin in built:
        groups[binary.identity(cubin)].append(genes)
    return [g for g in groups.values() if len(g) > 1]


def _alike(groups: list[list[Mapping[str, Any]]]) -> str:
    first = groups[0]
    differ = {k: sorted({repr(g[k]) for g in first}) for k in first[0] if len({repr(g[k]) for g in first}) > 1}
    what = "; ".join(f"{k} = {' | '.join(v)}" for k, v in differ.items())
    return (f"{sum(len(g) for g in groups) - len(groups)} genomes compile to the same binary as another, e.g. "
            f"{what} (the other genes equal): those values make one kernel; fine for a gene only launch() reads, a "
            f"silent mistake otherwise (a stale genes header, a gene the template ignores)")


def _report(prob: Problem, chosen: list[dict[str, Any]], dtype: str, results: list[tuple[dict, CompileOutput]],
            sources: Mapping[str, str]) -> tuple[list[str], tuple[str, str] | None]:
    """One dtype's lines (ptxas ranges, identical binaries, gene values that never compiled), and the first compile
    failure as (one line, the generated source around its error) or None."""
    built = [(g, o) for g, o in results if o.cubin is not None]
    failures = [(g, o) for g, o in results if o.cubin is None]
    tried: dict[tuple[str, Any], list[bool]] = defaultdict(list)
    for genes, out in results:
        for item in genes.items():
            tried[item].append(out.cubin is not None)
    lines = [f"compiled {len(built)}/{len(chosen)} genomes for {ARCH} ({dtype})"]
    if built:
        def span(field: str) -> str:
            values = [getattr(o.info, field) for _, o in built if getattr(o.info, field) is not None]
            return f"{min(values)}-{max(values)}" if values else "n/a"
        lines.append(f"ptxas: registers {span('registers')}, shared bytes {span('shared_bytes')}, spill stores "
                     f"{span('spill_stores')} B, stack {span('local_bytes')} B")
        same = identical([(g, o.cubin) for g, o in built])
        if same:
            lines.append(f"identical binaries ({dtype}): {_alike(same)}")
    never = sorted(f"{gene}={value!r}" for (gene, value), ok in tried.items() if not any(ok))
    if never:
        lines.append(f"gene values that never compiled: {', '.join(never)}")
    return lines, (_failure(prob, dtype, len(chosen), failures, sources) if failures else None)


def _failure(prob: Problem, dtype: str, total: int, failures: list, sources: Mapping[str, str]) -> tuple[str, str]:
    genes, out = failures[0]
    error = out.error or "?"
    head = next((ln for ln in error.splitlines() if "error" in ln), error[:200])
    context, hint = source_context(sources[Genome.of(genes).id], error, prob)
    return (f"{dtype}: {len(failures)} of {total} genomes do not compile; first {genes}: {head.strip()[:300]}{hint}",
            context)


def compile_all(prob: Problem, chosen: list[dict[str, Any]], dtypes: Sequence[str],
                compile_fn: Callable[[CompileJob], Any] = compile_one, workers: int = 1,
                emit: Callable[[str], None] = lambda line: None) -> None:
    """Render and compile each genome, dtype by dtype (on one pool of `workers` processes when there are enough
    genomes); emit each dtype's lines. CheckFailed ('compiles', with the generated source around the error) at the
    first dtype where a genome does not compile."""
    pooled = compile_fn is compile_one and workers > 1 and len(chosen) >= POOL_FROM
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))) \
            if pooled else None
        for dtype in dtypes:
            sources = {Genome.of(g).id: render.render(prob, Candidate(Genome.of(g)), dtype) for g in chosen}
            jobs = [CompileJob(gid, src, f"{prob.name}-{gid}-{dtype}.cu") for gid, src in sources.items()]
            outputs = run_jobs(jobs, compile_fn, pool, emit, dtype)
            lines, failed = _report(prob, chosen, dtype, [(g, outputs[Genome.of(g).id]) for g in chosen], sources)
            for line in lines:
                emit(line)
            if failed:
                fail("compiles", *failed)


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))
