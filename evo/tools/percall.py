"""`kernel-factory percall`: what one call of the exported RMSNorm op costs on the host, side by side with its peers.

For each provider and tiny shape, in one process on one GPU: the eager time of back-to-back calls (what a decoding
step pays), the time of the same calls replayed from a CUDA graph (the kernel alone, no host work), and their
difference, the host overhead per call. Also the op under torch.compile (fullgraph) called eagerly. Every provider's
output is checked against the fp64 formula before it is timed. Writes percall.json and percall.md to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

SHAPES = ((1, 1024), (8, 1024), (64, 1024), (1, 4096), (8, 4096), (64, 4096))
CALLS = 200          # calls per timed loop (and per captured graph)
REPEATS = 7          # loops per measurement; the median is reported


def _providers(torch: Any) -> dict[str, Callable[..., Any]]:
    """name -> f(x, w): each installed provider's forward on rows x (M, N) with an fp32 weight w."""
    from ...kernels import rmsnorm as op
    found: dict[str, Callable[..., Any]] = {"factory_op": lambda x, w: op.rmsnorm_fwd(x, w)[0]}
    compiled = torch.compile(lambda x, w: op.rmsnorm(x, w), fullgraph=True, dynamic=False)
    found["factory_op_compiled"] = compiled
    try:
        from quack.rmsnorm import rmsnorm_fwd as quack_fwd
        found["quack"] = lambda x, w: quack_fwd(x, w)[0]
    except Exception as exc:   # not installed, or installed without its compiler libraries (a RuntimeError)
        print(f"quack: not usable here ({exc})", file=sys.stderr)
    try:
        import rmsnorm as int21
        if hasattr(int21, "rmsnorm_fwd"):
            found["int21"] = lambda x, w: int21.rmsnorm_fwd(x, w)[0]
    except Exception as exc:
        print(f"int21: not usable here ({exc})", file=sys.stderr)
    found["torch_eager"] = lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w.to(x.dtype), 1e-6)
    return found


def _check(torch: Any, fn: Callable[..., Any], x: Any, w: Any) -> str | None:
    want = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6) * w.double()
    got = fn(x, w)
    if not torch.isfinite(got).all():
        return "non-finite output"
    err = ((got.double() - want).norm() / want.norm()).item()
    return None if err < 1e-2 else f"relative error {err:.2e}"


def _eager_us(torch: Any, fn: Callable[..., Any], x: Any, w: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        start.record()
        for _ in range(CALLS):
            fn(x, w)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return statistics.median(times)


def _graph_us(torch: Any, fn: Callable[..., Any], x: Any, w: Any) -> float | None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(CALLS):
                fn(x, w)
    except Exception as exc:   # a provider that cannot be captured: reported, not fatal
        print(f"graph capture failed: {exc}", file=sys.stderr)
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return statistics.median(times)


def measure(dtype_name: str = "bfloat16") -> dict[str, Any]:
    import torch
    dtype = getattr(torch, dtype_name)
    providers = _providers(torch)
    rows = []
    for m, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(m * 7919 + n)
        x = torch.randn(m, n, generator=gen, device="cuda").to(dtype)
        w = torch.randn(n, generator=gen, device="cuda")
        for name, fn in providers.items():
            why = _check(torch, fn, x, w)
            row: dict[str, Any] = {"m": m, "n": n, "dtype": dtype_name, "provider": name, "wrong": why}
            if why is None:
                eager, graph = _eager_us(torch, fn, x, w), _graph_us(torch, fn, x, w)
                row.update(eager_us=round(eager, 3), graph_us=None if graph is None else round(graph, 3),
                           host_us=None if graph is None else round(eager - graph, 3))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls_per_loop": CALLS,
            "repeats": REPEATS, "rows": rows}


def table(result: dict[str, Any]) -> str:
    """Markdown: per shape, each provider's eager, graph and host µs, and ours against the fastest peer."""
    peers = ("quack", "int21", "torch_eager")
    lines = [f"Per-call cost on {result['gpu']} (torch {result['torch']}), µs per call, median of "
             f"{result['repeats']} loops of {result['calls_per_loop']} calls", "",
             "| M×N | provider | eager | graph | host | host vs fastest peer | eager vs fastest peer |",
             "|---|---|---|---|---|---|---|"]
    shapes = sorted({(r["m"], r["n"]) for r in result["rows"]}, key=lambda s: (s[1], s[0]))
    for m, n in shapes:
        rows = {r["provider"]: r for r in result["rows"] if (r["m"], r["n"]) == (m, n)}
        timed = [rows[p] for p in peers if p in rows and rows[p].get("host_us") is not None]
        best_host = min((r["host_us"] for r in timed), default=None)
        best_eager = min((r["eager_us"] for r in timed), default=None)
        for name, r in rows.items():
            if r.get("wrong"):
                lines.append(f"| {m}×{n} | {name} | wrong: {r['wrong']} | | | | |")
                continue
            host = r.get("host_us")
            vs_host = f"{host / best_host:.2f}x" if host is not None and best_host else ""
            vs_eager = f"{r['eager_us'] / best_eager:.2f}x" if best_eager else ""
            lines.append(f"| {m}×{n} | {name} | {r['eager_us']:.2f} | {r.get('graph_us') or '-'} | "
                         f"{host if host is not None else '-'} | {vs_host} | {vs_eager} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernel-factory percall", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/percall", help="folder for percall.json and percall.md")
    parser.add_argument("--from", dest="source", help="re-render a recorded percall.json (no GPU needed)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    if args.source:
        result = json.loads(Path(args.source).read_text())
    else:
        import torch
        if not torch.cuda.is_available():
            print("kernel-factory percall: needs a CUDA GPU; re-render a recorded result with --from FILE",
                  file=sys.stderr)
            return 2
        result = measure(args.dtype)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "percall.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / "percall.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
