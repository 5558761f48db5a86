"""The held-out validation of a workload campaign: its learned dispatch benched on shapes no search saw, against
every peer, side by side in one process per dtype (`kernel-factory bench` rows: L2 flushed, interleaved, short
launches as CUDA-graph replays), and one line per dtype:

    held-out fwd bf16: geomean 1.01x best peer over 48 shapes, worst 0.91x at 1x4096

A peer that fails on a shape, or whose output misses the problem's tolerance there, is named in the report and
the row compares with the next peer. `kernel-factory heldout FOLDER` benches (GPU); `--from BENCH.json` re-renders
a recorded bench anywhere.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import registry
from ..config import ConfigError, RunConfig
from ..types import Case
from . import bench, bench_report, bench_suite

PEERS = ("int21", "quack", "liger", "torch_eager")   # QuACK untuned: its autotuner costs ~45 s per new shape
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
BENCH = "heldout-bench.json"
REPORT = "heldout.md"


def part_name(problem: str) -> str:
    return "bwd" if problem.endswith("_bwd") else "fwd"


def row_ratio(row: Mapping[str, Any], peers: Sequence[str]) -> tuple[float | None, str, list[str]]:
    """(best eligible peer's time / ours, that peer, notes on peers left out: failed or outside tolerance)."""
    providers = row["providers"]
    notes, timed = [], []
    for name in peers:
        entry = providers.get(name)
        if entry is None:
            continue
        if "error" in entry:
            notes.append(f"{name} failed: {entry['error'][:80]}")
        elif "note" in entry:
            notes.append(f"{name} left out: {entry['note'][:80]}")
        elif "us" in entry:
            timed.append((entry["us"], name))
    ours = providers.get(bench.SUBJECT, {}).get("us")
    if not timed or not ours:
        return None, "", notes
    us, name = min(timed)
    return us / ours, name, notes


def summarize(result: Mapping[str, Any], problem: str) -> tuple[list[str], str]:
    """(the per-dtype lines, the markdown report) of a held-out bench (one bench result per dtype, joined)."""
    parts = result["parts"] if result.get("format") == bench_suite.FORMAT else [result]
    rows = [r for part in parts for r in part["rows"]]
    peers = [p for p in PEERS if any(p in r["providers"] for r in rows)]
    lines, table = [], []
    for dtype in sorted({r["dtype"] for r in rows}, key=list(SHORT).index):
        ratios = []
        for r in (r for r in rows if r["dtype"] == dtype):
            ratio, peer, notes = row_ratio(r, peers)
            shape = "x".join(map(str, r["shape"]))
            if ratio is not None:
                ratios.append((ratio, shape))
            mine = r["providers"].get(bench.SUBJECT, {})
            table.append(f"| {SHORT[dtype]} | {shape} | {_fmt(mine.get('us'))} | {peer or '-'} | "
                         f"{_fmt(ratio, '.3f')} | {_fmt(mine.get('pct_copy'), '.0f')} | "
                         f"{'; '.join(notes) or mine.get('error', '')} |")
        if not ratios:
            lines.append(f"held-out {part_name(problem)} {SHORT[dtype]}: no shape with both ours and a peer timed")
            continue
        geo = bench_report.geomean([v for v, _ in ratios])
        worst = min(ratios)
        lines.append(f"held-out {part_name(problem)} {SHORT[dtype]}: geomean {geo:.2f}x best peer over "
                     f"{len(ratios)} shapes, worst {worst[0]:.2f}x at {worst[1]}")
    md = "\n".join(["# Held-out validation", "", f"Peers: {', '.join(peers)} (the best correct one per row).", "",
                    *[f"- `{line}`" for line in lines], "",
                    "| dtype | shape | ours µs | best peer | peer / ours | ours % copy | notes |",
                    "|---|---|---|---|---|---|---|", *table]) + "\n"
    return lines, md


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def bench_heldout(problem: str, table: Path, cases: Sequence[Case], out: Path, reps: int = 20) -> dict[str, Any]:
    """Bench the table on the held-out cases, one bench per dtype, joined (needs a GPU). After every row the result
    so far is written to `out`, so that a bench cut short keeps what it measured."""
    dtypes = sorted({c.dtype for c in cases})
    parts: list[dict[str, Any]] = []

    def keep(partial: dict[str, Any]) -> None:
        out.write_text(json.dumps(bench_suite.join([*parts, partial], [f"held-out {d}" for d in dtypes]), indent=1))
    for dtype in dtypes:
        shapes = ",".join("x".join(map(str, c.shape)) for c in cases if c.dtype == dtype)
        parts.append(bench.run(problem, {"table": str(table)}, shapes, [dtype], list(PEERS), reps, 1, 30.0,
                               on_row=keep))
    return bench_suite.join(parts, [f"held-out {d}" for d in dtypes])


def validate(cfg: RunConfig, folder: Path, p: Any) -> list[str]:
    """Step 5 of a campaign: bench on a GPU and write the report; elsewhere, say how to run it."""
    from ..evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        print(f"workload: the held-out bench needs a GPU ({reason}); run `kernel-factory heldout {folder}` on "
              f"one", file=sys.stderr)
        return []
    result = bench_heldout(cfg.problem, folder / "kernels" / "dispatch.json", p.split.heldout, folder / BENCH)
    return write(result, cfg.problem, folder)


def write(result: Mapping[str, Any], problem: str, folder: Path) -> list[str]:
    lines, md = summarize(result, problem)
    (folder / BENCH).write_text(json.dumps(result, indent=1) + "\n")
    (folder / REPORT).write_text(md)
    print("\n".join(lines))
    return lines


def main_heldout(folder: str, from_json: str | None) -> int:
    """`kernel-factory heldout FOLDER [--from BENCH.json]`."""
    path = Path(folder)
    plan_file = path / "workload.json"
    if not plan_file.is_file():
        raise ConfigError(f"heldout: {folder!r} is not a workload campaign folder (no workload.json)")
    plan = json.loads(plan_file.read_text())
    problem = plan["config"]["problem"]
    registry.load("problem", problem)
    if from_json:
        try:
            result = json.loads(Path(from_json).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"heldout --from {from_json!r}: {exc}") from None
        lines, md = summarize(result, problem)
        print(md if not lines else "\n".join(lines))
        return 0
    result = bench_heldout(problem, path / "kernels" / "dispatch.json", [Case.parse(k) for k in plan["heldout"]],
                           path / BENCH)
    write(result, problem, path)
    return 0
