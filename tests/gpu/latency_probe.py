"""Where the forward's time goes on small shapes (issue 28), measured on a GPU host:
`python3 tests/gpu/latency_probe.py [--per-dtype K] [--budget SECONDS]`.

On the held-out benches most rows the op loses are latency-bound: a few microseconds in all, 0.5 to 1.2 us above
the best peer (e.g. bf16 1x128: 5.52 us against torch.compile's 4.32, h200-shipped-fwd-2026-12-06). This probe
separates the possible causes on seeded small shapes of the workload (none a campaign's training or held-out shape):
- every kernel of the op's table for the dtype, launched directly (the tuned op's best choice, without the op);
- a minimal kernel written here (`lean`: sub-warp or warp rows, x and w loaded together up front, one butterfly, no
  alternative paths, a few hundred bytes of code), to see how far the template's structure is from the floor;
- the same kernel with several kilobytes of dead code in front of its path (`lean+pad`), to see what the code size
  of a cold kernel costs after the protocol's L2 flush (instruction fetch from memory);
- the op as users call it, every declared peer that loads, and a copy of the row's bytes;
- with --grid, a grid of the template's genomes for small shapes (sub-warp to 4-warp rows, 128- and 256-thread CTAs,
  8- and 16-byte vectors, x kept or re-read, the weight ahead or not), each checked then timed once as the benches
  time (flushed); written as a panel per dtype ($OUT/latency-panels/panel-<dtype>.jsonl, a workload campaign's
  format), so that `kernel-factory widen $OUT/latency-panels --problem rmsnorm_fwd --where log2_n<=13` adds the
  grid's winners to the op's table as tuning candidates for rows of at most 8192 elements.
Each is timed twice, side by side: as the benches time it (CUDA graph replays, the L2 flushed before each, median of
REPS interleaved samples) and hot (32 launches back to back in one graph, caches warm, per launch).
Writes $OUT/latency_probe.json (raw) and $OUT/latency_probe.txt (rows and per-dtype geomeans) after every shape, so
that a cut call keeps what it measured. No assertion on times: a benchmark, not a test."""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from kernel_factory.evo.evaluate import gate, launcher, measure, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.protocols import Launch
from kernel_factory.evo.tools import bench, peers
from kernel_factory.evo.types import Case
from kernel_factory.evo.workload import draw, narrow
from kernel_factory.problems.rmsnorm_fwd import EPS, problem

import grid_study   # tests/gpu/grid_study.py, beside this file

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "kernels/ops/rmsnorm_fwd.json"
CAMPAIGNS = sorted((ROOT / "docs/results/workload").glob("h200-*/workload.json"))
SEED, REPS, HOT = 31, 30, 32
PAD = 1000  # instructions lean+pad branches over: the template's kernels have 900 to 2100
LEFT_OUT = {"quack_tuned": "autotunes per shape (tens of seconds each)"}
PEERS = tuple(p.baseline for p in problem.declared_peers if p.baseline not in LEFT_OUT)
DTYPE_CODE = {"bfloat16": 0, "float16": 1, "float32": 2}
GRID = grid_study.grid(problem, "small")   # tests/gpu/grid_study.py: the forward's small-shape grid


LEAN = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#if DT == 0
typedef __nv_bfloat16 T;
#elif DT == 1
typedef __half T;
#else
typedef float T;
#endif
constexpr int ROWS = 128 / TPR;   // rows per CTA of 128 threads; a row's TPR lanes sit in one warp
constexpr int E = 8;              // elements per thread loaded up front, x and w together

__device__ __forceinline__ float f32(T v) { return (float)v; }

extern "C" __global__ void __launch_bounds__(128)
lean_fwd(const T* __restrict__ x, const float* __restrict__ w, T* __restrict__ y, float* __restrict__ rstd,
         int M, int N, float eps) {
  const int grp = threadIdx.x / TPR, lane = threadIdx.x % TPR;
  const int row = blockIdx.x * ROWS + grp;
  const bool active = row < M;
  const T* xr = x + (size_t)(active ? row : 0) * N;
  T* yr = y + (size_t)(active ? row : 0) * N;
#if PAD
  // PAD instructions on the live path's way that it branches over (eps is never negative here): the path's first
  // load sits PAD * 16 bytes further into the binary, as the vector path of a template kernel sits behind its
  // scalar path.
  float dead = eps;
  asm volatile("{\n .reg .pred p;\n setp.ge.f32 p, %0, 0f00000000;\n @p bra.uni PAD_DONE;\n" PAD_BODY
               "PAD_DONE:\n}" : "+f"(dead));
  if (dead == 1234.5f) rstd[0] = dead;
#endif
  float xs[E], ws[E];
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const int i = lane + j * TPR;
    xs[j] = active && i < N ? f32(xr[i]) : 0.f;
    ws[j] = i < N ? __ldg(w + i) : 0.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < E; ++j) ss = fmaf(xs[j], xs[j], ss);
#pragma unroll 4
  for (int i = lane + E * TPR; i < N; i += TPR) if (active) { const float f = f32(xr[i]); ss = fmaf(f, f, ss); }
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / (float)N + eps);
  if (!active) return;
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const int i = lane + j * TPR;
    if (i < N) yr[i] = (T)(xs[j] * r * ws[j]);
  }
#pragma unroll 4
  for (int i = lane + E * TPR; i < N; i += TPR) yr[i] = (T)(f32(xr[i]) * r * __ldg(w + i));
}
"""


def shapes(per_dtype: int) -> list[Case]:
    """Seeded small shapes (M up to 1024, N up to 8192, at most 4 MB of x) of the problem's workload, none of them a
    committed campaign's training or held-out shape."""
    seen = {Case.parse(k) for path in CAMPAIGNS for part in ("train", "heldout")
            for k in json.loads(path.read_text()).get(part, [])}
    small = narrow(problem.workload, m=(1, 1024), n=(problem.workload.n[0], 8192))
    rng = random.Random(SEED)
    out = []
    for dtype in problem.dtypes:
        picked = [c for c in draw(small, dtype, per_dtype * 4, rng, exclude=seen)
                  if c.shape[0] * c.shape[1] * torch.finfo(getattr(torch, dtype)).bits // 8 <= 4 << 20]
        out += picked[:per_dtype]
    return out


def lean_variants() -> dict[tuple[str, int, int], tuple[bytes, int]]:
    """(dtype, TPR, PAD) -> (cubin, SASS instruction count), compiled with NVRTC for this GPU's arch."""
    compiler = Compiler(tempfile.mkdtemp(prefix="kf-lean-"), workers=os.cpu_count() or 8)
    jobs, keys = [], {}
    for dtype, code in DTYPE_CODE.items():
        for tpr in (4, 8, 16, 32):
            for pad in (0, PAD):
                body = " fma.rn.f32 %0, %0, %0, %0;\\n" * pad
                src = f'#define DT {code}\n#define TPR {tpr}\n#define PAD {pad}\n#define PAD_BODY "{body}"\n{LEAN}'
                key = hashlib.sha256(src.encode()).hexdigest()[:16]
                jobs.append(CompileJob(key, src, f"lean-{dtype}-{tpr}-{pad}.cu"))
                keys[dtype, tpr, pad] = key
    outs = {o.key: o for o in compiler.compile_many(jobs)}
    compiler.close()
    bad = {k: outs[v].error[:400] for k, v in keys.items() if outs[v].cubin is None}
    if bad:
        raise SystemExit(f"lean kernels that do not compile: {bad}")
    made = {}
    for k, v in keys.items():
        cubin = outs[v].cubin
        try:
            count = sum(sass.opcodes(sass.disassemble(cubin)).values())
        except Exception:   # no disassembler on the host: the count is only a note
            count = -1
        made[k] = (cubin, count)
    return made


def lean_tpr(n: int) -> int:
    """Lanes per row: enough that the first E elements per lane cover the row, at most a warp."""
    for tpr in (4, 8, 16):
        if n <= tpr * 8:
            return tpr
    return 32


def lean_fn(module: launcher.Module, tpr: int, case: Case, inputs: dict, stream: Any) -> Callable[[], Any]:
    m, n = case.shape
    outputs = problem.make_outputs(case, "cuda")
    gate.poison(outputs)
    rows = 128 // tpr
    plan = Launch(((m + rows - 1) // rows, 1, 1), (128, 1, 1), 0,
                  (inputs["x"], inputs["w"], outputs["y"], outputs["rstd"], np.int32(m), np.int32(n),
                   np.float32(EPS)), kernel="lean_fwd")
    run = launcher.launcher(stream, module, plan)
    return lambda: (run(), outputs)[1]


def table_fns(table: dict, case: Case, inputs: dict, stream: Any, modules: dict) -> dict[str, Callable[[], Any]]:
    out = {}
    for key, kernel in table["kernels"].items():
        gid, dtype = key.split(":")
        if dtype != case.dtype:
            continue
        if key not in modules:
            modules[key] = launcher.Module((TABLE.parent / kernel["cubin"]).read_bytes(), problem.kernel_name)
        genes = {**problem.space.defaults(), **table["genomes"][gid]["genes"]}
        out[f"table {gid}"] = grid_study.runner(problem, modules[key], genes, case, inputs, stream)
    return out


def hot_us(fn: Callable[[], Any]) -> float:
    """Per launch, HOT launches back to back in one CUDA graph, caches warm: median of five replays."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
        for _ in range(HOT):
            fn()
    g.replay()
    samples = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / HOT)
    return sorted(samples)[2]


def measure_case(case: Case, table: dict, lean: dict, modules: dict, timer: measure.Timer, stream: Any,
                 loaded: list[str], grid: dict | None) -> dict[str, Any]:
    inputs = problem.make_inputs(case, seed=2026, device="cuda")
    row: dict[str, Any] = {"case": case.key, "bytes": problem.bytes_moved(case), "failed": {}}
    if grid is not None:
        row["grid_us"], row["grid_failed"] = grid_study.grid_times(problem, GRID, grid, case, inputs, stream)
        top = sorted(row["grid_us"], key=row["grid_us"].get)[:3]
        row["grid_top"] = {g: GRID[g] for g in top}
    tpr = lean_tpr(case.shape[1])
    fns: dict[str, Callable[[], Any]] = table_fns(table, case, inputs, stream, modules)
    for pad in (0, PAD):
        key = (case.dtype, tpr, pad)
        if key not in modules:
            modules[key] = launcher.Module(lean[key][0], "lean_fwd")
        fns["lean+pad" if pad else "lean"] = lean_fn(modules[key], tpr, case, inputs, stream)
    row["lean_tpr"] = tpr
    for gid in row.get("grid_top", {}):
        fns[f"grid {gid}"] = grid_study.runner(problem, grid[gid, case.dtype], GRID[gid], case, inputs, stream)
    for name in ("factory_op", *loaded):
        try:
            fns[name] = problem.baseline(name, case, inputs)
        except Exception as exc:   # a peer that refuses this shape
            row["failed"][name] = bench.failure(exc)
    for name in list(fns):
        why = bench.check(problem, case, inputs, fns[name])
        if why:
            row["failed"][name] = why
            del fns[name]
    fns["copy"] = bench.row_copy(row["bytes"])
    timed, graphed = bench.graph_where_short(timer, fns)
    times = timer.time_interleaved(list(timed.values()), REPS)
    row["us"] = {n: t.median_us for n, t in zip(timed, times)}
    row["graphed"] = sorted(graphed)
    row["hot_us"] = {}
    for name, fn in fns.items():
        try:
            row["hot_us"][name] = hot_us(fn)
        except Exception as exc:   # a provider that cannot be captured: no hot figure
            row["failed"][f"{name} (hot)"] = bench.failure(exc)
    return row


def best(us: dict[str, float], names: list[str]) -> tuple[str | None, float]:
    got = [(us[n], n) for n in names if n in us]
    return (min(got)[1], min(got)[0]) if got else (None, math.nan)


def lines_of(row: dict, loaded: list[str]) -> list[str]:
    out = []
    for label, us in (("flushed", row["us"]), ("hot", row["hot_us"])):
        peer, p = best(us, loaded)
        tab, t = best(us, [n for n in us if n.startswith("table ")])
        top, g = best(us, [n for n in us if n.startswith("grid ")])
        parts = [f"best peer {peer} {p:.2f}", f"op {us.get('factory_op', math.nan):.2f}",
                 f"best table kernel {tab} {t:.2f}", f"grid's best {top} {g:.2f}", f"lean {us.get('lean', math.nan):.2f}",
                 f"lean+pad {us.get('lean+pad', math.nan):.2f}", f"copy {us.get('copy', math.nan):.2f}"]
        out.append(f"{row['case']:>22} {label:>7} us: " + ", ".join(parts))
    out.append(f"{'':>31}peers flushed: " + ", ".join(f"{p} {row['us'][p]:.2f}" for p in loaded if p in row["us"])
               + "".join(f"; {n}: {w[:80]}" for n, w in row["failed"].items() if not n.startswith("table ")))
    return out


def summary(rows: list[dict], loaded: list[str]) -> list[str]:
    out = []
    for dtype in problem.dtypes:
        mine = [r for r in rows if r["case"].startswith(dtype + ":")]
        for label, field in (("flushed", "us"), ("hot", "hot_us")):
            ratios: dict[str, list[float]] = {}
            for r in mine:
                us = r[field]
                p = best(us, loaded)[1]
                if math.isnan(p):
                    continue
                for name, t in (("op", us.get("factory_op")),
                                ("best table kernel", best(us, [n for n in us if n.startswith("table ")])[1]),
                                ("grid's best (oracle)", best(us, [n for n in us if n.startswith("grid ")])[1]),
                                ("lean", us.get("lean")), ("lean+pad", us.get("lean+pad")), ("copy", us.get("copy"))):
                    if t and not math.isnan(t):
                        ratios.setdefault(name, []).append(p / t)
            for name, vals in ratios.items():
                geo = math.exp(sum(map(math.log, vals)) / len(vals))
                out.append(f"latency fwd {dtype} {label}: {name}: geomean {geo:.2f}x best peer over {len(vals)} "
                           f"shapes, worst {min(vals):.2f}x")
    return out


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--per-dtype", type=int, default=8)
    args.add_argument("--budget", type=float, default=math.inf, metavar="SECONDS")
    args.add_argument("--grid", action="store_true", help="also time the template grid and write its panels")
    opts = args.parse_args()
    start = time.monotonic()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    cases = shapes(opts.per_dtype)
    loaded = [p for p in PEERS if peers.load_error(next(x for x in problem.declared_peers if x.baseline == p)) is None]
    missing = [p for p in PEERS if p not in loaded]
    lean = lean_variants()
    grid = grid_study.compile_grid(problem, GRID) if opts.grid else None
    timer, stream, _, head = bench.session(250.0)
    head.update(device=torch.cuda.get_device_name(), peers=loaded, missing=missing, left_out=LEFT_OUT, seed=SEED,
                lean_sass={f"{d}-{t}-{p}": c for (d, t, p), (_, c) in lean.items()})
    table = json.loads(TABLE.read_text())
    text = [f"RMSNorm forward, small shapes, {head['device']}: median us; peers {loaded}"
            + (f" (without {', '.join(missing)}: did not load)" if missing else "")
            + "".join(f"; {name} left out: {why}" for name, why in LEFT_OUT.items()),
            "lean SASS instructions (dtype-TPR-PAD): " + ", ".join(f"{k} {v}" for k, v in head["lean_sass"].items())]
    print("\n".join(text), flush=True)
    rows: list[dict] = []
    modules: dict = {}
    order = [c for group in zip(*[[c for c in cases if c.dtype == d] for d in problem.dtypes]) for c in group]
    for case in order:
        if time.monotonic() - start > opts.budget:
            print(f"cut at {opts.budget:.0f} s: {len(rows)} of {len(order)} shapes", flush=True)
            break
        rows.append(measure_case(case, table, lean, modules, timer, stream, loaded, grid))
        text += lines_of(rows[-1], loaded)
        print("\n".join(lines_of(rows[-1], loaded)), flush=True)
        if out:
            (out / "latency_probe.json").write_text(json.dumps({"head": head, "rows": rows}, indent=1))
            if grid is not None:
                grid_study.write_panels(problem, GRID, [{**r, "failed": r.get("grid_failed", {})} for r in rows],
                                        out / "latency-panels")
    text += summary(rows, loaded)
    print("\n".join(summary(rows, loaded)))
    if out:
        (out / "latency_probe.txt").write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    sys.exit(main())
