"""The held-out validation of a workload campaign: its learned dispatch benched on shapes no search saw, against
every peer the problem declares for such shapes (not the tuned ones: they tune at every new shape), side by side in
one process per dtype (`kernel-factory bench` rows: L2 flushed, interleaved, short launches as CUDA-graph replays),
and one line per dtype:

    held-out fwd bf16: geomean 1.07x best peer over 48 shapes (without QuACK), worst 0.62x at 1x8192

A peer that cannot load stops the command before anything is timed, unless `--without` leaves it out; the note in
parentheses then says so, and says where a peer crashed ("INT21 crashed on 1 row"). A peer that fails or crashes on
a shape, or whose output misses the problem's tolerance there, is named in the report and the row compares with the
next peer. The op as shipped (its committed table) is timed in the same process beside the learned table, never as
a peer: its line per dtype (`against the shipped op fwd bf16: ...`) is the test an export must pass.
`kernel-factory heldout FOLDER` benches (GPU); `--from BENCH.json` re-renders a recorded bench anywhere (one recorded
before benches named their peers included: what ran is read from its rows).
"""
from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import registry
from ..config import ConfigError, RunConfig
from ..protocols import Problem
from ..types import Case
from . import bench, bench_report, bench_suite, peers

SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
BENCH = "heldout-bench.json"   # committed as heldout-bench.json.xz (docs/results: a tenth of the bytes)


def read_bench(path: str | Path) -> dict[str, Any]:
    """A recorded held-out bench, as written or xz-compressed (a name ending in .xz)."""
    raw = Path(path).read_bytes()
    return json.loads(lzma.decompress(raw) if str(path).endswith(".xz") else raw)


def write_bench(result: Mapping[str, Any], path: str | Path) -> None:
    """read_bench's other half: xz-compressed (the JSON on one line) where the name ends in .xz."""
    packed = str(path).endswith(".xz")
    data = (json.dumps(result, separators=(",", ":")) if packed else json.dumps(result, indent=1)) + "\n"
    Path(path).write_bytes(lzma.compress(data.encode()) if packed else data.encode())
REPORT = "heldout.md"


def part_name(problem: str) -> str:
    return "bwd" if problem.endswith("_bwd") else "fwd"


def row_ratio(row: Mapping[str, Any], ran: Sequence[str]) -> tuple[float | None, str, list[str]]:
    """(best eligible peer's time / ours, that peer, notes on peers left out of the row: crashed, failed or outside
    tolerance), among the peers that ran somewhere in the bench."""
    providers = row["providers"]
    mine = providers.get(bench.SUBJECT, {})
    notes, timed = [], []
    for name in ran:
        entry = providers.get(name)
        if entry is None:
            continue
        if "error" in entry:
            notes.append(f"{name} {'crashed' if peers.crashed(entry) else 'failed'}: {entry['error'][:80]}")
        elif "note" in entry:
            notes.append(f"{name} left out: {entry['note'][:80]}")
        elif "us" in entry and "us" in mine and not peers.comparable(mine, entry):
            notes.append(f"{name} timed eagerly ({entry['us']:.1f} µs, host path and all) beside our graph replay: "
                         f"not comparable")
        elif "us" in entry:
            timed.append((entry["us"], name))
    ours = mine.get("us")
    if not timed or not ours:
        return None, "", notes
    us, name = min(timed)
    return us / ours, name, notes


def summarize(result: Mapping[str, Any], problem: str) -> tuple[list[str], str]:
    """(the per-dtype lines, then those against the shipped op; the markdown report) of a held-out bench (one bench
    result per dtype, joined)."""
    parts = result["parts"] if result.get("format") == bench_suite.FORMAT else [result]
    found = []   # (dtype, line, the peers that ran, details, table rows)
    for part in parts:
        for dtype in peers.dtypes_of(part):
            acct, table = peers.account(part, dtype, problem), []
            found.append((dtype, headline(part, dtype, acct, problem, table), acct.ran,
                          [f"- {SHORT[dtype]}: {line}" for line in acct.details()], table))
    found.sort(key=lambda f: list(SHORT).index(f[0]))
    ran = {", ".join(f[2]) for f in found}
    said = (f"Peers: {ran.pop()} (the best correct one per row)." if len(ran) == 1 else
            "Peers, the best correct one per row of: " + "; ".join(f"{SHORT[f[0]]} {', '.join(f[2]) or 'none'}"
                                                                 for f in found) + ".")
    details = [line for f in found for line in f[3]]
    shipped = [line for part in parts for dtype in peers.dtypes_of(part)
               for line in (op_line(part, dtype, problem), against_op(part, dtype, problem)) if line]
    tuned = [p.label for p in peers.declared(registry.load("problem", problem)) if p.tuned]
    if tuned:
        said += (f" Not timed on held-out shapes, by the problem's declaration: {', '.join(tuned)} (it tunes itself "
                 f"at every new shape; it is timed on the benchmark rows).")
    cut = [f"**Partial**: {result['partial']}; only what was measured is here."] if result.get("partial") else []
    weighed = {SHORT[d]: sum(1 for r in part["rows"] if r["dtype"] == d and timing_notes(
        r, part.get("flush_us"), [bench.SUBJECT, row_ratio(r, peers.account(part, d, problem).ran)[1], peers.OWN_OP]))
        for part in parts for d in peers.dtypes_of(part)}
    weigh = []
    if any(weighed.values()):
        weigh = [f"Rows with a time to weigh (ours, the best peer's or the op's: its host path inside, noisy, GPU "
                f"memory short, or the op's tuning keeping a slower kernel than the rule's; the notes say which): " + ", ".join(f"{d} {n}" for d, n in weighed.items()) + "."]
    md = "\n".join(["# Held-out validation", "", said, "", *cut, *([""] if cut else []), *[f"- `{f[1]}`" for f in found], "",
                    *(["The op as shipped (its committed table at the bench's date; from 2026-12-06 on, tuned on each "
                       "shape's first call) against the best peer, and the learned table against it, timed in the "
                       "same process (above 1 the learned table is faster):", *[f"- `{line}`" for line in shipped], ""]
                      if shipped else []),
                    *(["Peers that did not run on every shape:", *details, ""] if details else []),
                    "| dtype | shape | ours µs | best peer | peer / ours | ours % copy | notes |",
                    "|---|---|---|---|---|---|---|", *[row for f in found for row in f[4]],
                    *([""] if weigh else []), *weigh]) + "\n"
    return [f[1] for f in found] + shipped, md


def headline(part: Mapping[str, Any], dtype: str, acct: peers.Account, problem: str, table: list[str],
             who: str = "") -> str:
    """One dtype's line (its table rows appended to `table`): geomean and worst row against the best peer that ran;
    `who` names what was compared when it is not the learned table ("op as shipped")."""
    ratios = []
    for r in (r for r in part["rows"] if r["dtype"] == dtype):
        ratio, peer, notes = row_ratio(r, acct.ran)
        shape = "x".join(map(str, r["shape"]))
        if ratio is not None:
            ratios.append((ratio, shape))
        mine = r["providers"].get(bench.SUBJECT, {})
        notes += timing_notes(r, part.get("flush_us"), [bench.SUBJECT, peer, peers.OWN_OP])
        table.append(f"| {SHORT[dtype]} | {shape} | {_fmt(mine.get('us'))} | {peer or '-'} | "
                     f"{_fmt(ratio, '.3f')} | {_fmt(mine.get('pct_copy'), '.0f')} | "
                     f"{'; '.join(notes) or mine.get('error', '') or r.get('crashed', '')} |")
    note = "; ".join(n for n in (acct.note(), part.get("partial") and f"cut short: {part['partial']} benched") if n)
    note = f" ({note})" if note else ""
    if not ratios:
        return f"held-out {part_name(problem)} {SHORT[dtype]}{who}: no shape with both ours and a peer timed{note}"
    geo = bench_report.geomean([v for v, _ in ratios])
    worst = min(ratios)
    return (f"held-out {part_name(problem)} {SHORT[dtype]}{who}: geomean {geo:.2f}x best peer over {len(ratios)} "
            f"shapes{note}, worst {worst[0]:.2f}x at {worst[1]}")


def timing_notes(row: Mapping[str, Any], flush_us: float | None, names: Sequence[str]) -> list[str]:
    """Notes on the times a row's ratios stand on (ours, the best peer's, the op's) that a reader should weigh: part
    of the host path inside the time, samples spread wide, or GPU memory short while the row was timed."""
    out = [short] if (short := peers.memory_short(row)) else []
    for name in dict.fromkeys(n for n in names if n):
        entry = row["providers"].get(name, {})
        if "us" not in entry:
            continue
        who = "ours" if name == bench.SUBJECT else name
        if peers.host_inside(entry, flush_us):
            hold = f", hold {entry['hold_us']:.1f} µs" if entry.get("hold_us") else ""
            out.append(f"{who} {entry['us']:.1f} µs with its host path inside (host {entry['host_us']:.1f} µs a "
                       f"call, flush {flush_us:.1f} µs{hold})")
        if peers.noisy(entry):
            out.append(f"{who} {entry['us']:.1f} µs noisy (IQR {100 * entry['iqr_us'] / entry['us']:.0f}% of it)")
    ran, ours = row["providers"].get(peers.OWN_OP, {}), row["providers"].get(bench.SUBJECT, {}).get("us")
    picked = ran.get("kernels", {})
    # a slower time of the op with its host path inside is the host's, not the tuning's pick (noted above)
    if picked.get("kernel") and picked.get("kernel") != picked.get("rule") and ours and ran.get("us", 0) > 1.1 * ours \
            and not peers.host_inside(ran, flush_us):
        out.append(f"the op's tuning kept {picked['kernel']}, not the rule's {picked.get('rule', '?')}, and ran "
                   f"{ran['us'] / ours:.2f}x the table's time")
    return out


def op_line(part: Mapping[str, Any], dtype: str, problem: str) -> str | None:
    """One dtype's line for the op as shipped (the 'factory_op' provider: its table, tuned on each shape's first
    call) against the best peer, as the learned table's line is made; None where the op was not timed."""
    rows = [{**r, "providers": {**r["providers"], bench.SUBJECT: r["providers"][peers.OWN_OP]}}
            for r in part["rows"] if r["dtype"] == dtype and peers.OWN_OP in r["providers"]]
    if not rows:
        return None
    return headline({**part, "rows": rows}, dtype, peers.account(part, dtype, problem), problem, [],
                    ", op as shipped")


def against_op(part: Mapping[str, Any], dtype: str, problem: str) -> str | None:
    """One dtype's line for the learned table against the shipped op, over the rows where both were timed."""
    rows = [r for r in part["rows"] if r["dtype"] == dtype and "us" in r["providers"].get(peers.OWN_OP, {})
            and "us" in r["providers"].get(bench.SUBJECT, {})]
    ratios = sorted((v, "x".join(map(str, r["shape"]))) for r in rows if (v := bench_report.ratio(r, peers.OWN_OP)))
    if not ratios:
        return None
    apart = len(rows) - len(ratios)
    return (f"against the shipped op {part_name(problem)} {SHORT[dtype]}: geomean "
            f"{bench_report.geomean([v for v, _ in ratios]):.2f}x over {len(ratios)} shapes, worst {ratios[0][0]:.2f}x "
            f"at {ratios[0][1]}" + (f" ({apart} more not comparable: the op timed eagerly beside the table's graph "
                                    f"replay, and slower)" if apart else ""))


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def bench_heldout(problem: str, table: Path, cases: Sequence[Case], out: Path, reps: int = 20,
                  without: Sequence[str] = (), earlier: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Bench the table on the held-out cases, one bench per dtype, joined (needs a GPU). Every peer is checked to
    load before the first dtype is timed. After every row the result so far is written to `out`, so that a bench
    cut short keeps what it measured. With `earlier` (that bench, cut short: --go-on) only the cases it lacks are
    timed; its rows stay, each measured side by side as before, and a dtype it finished is not timed again."""
    from ..evaluate.gpu import gpu_unavailable_reason
    dtypes = sorted({c.dtype for c in cases})
    on_gpu = gpu_unavailable_reason() is None   # elsewhere the first bench says it needs a GPU, and how to re-render
    plugin = registry.load("problem", problem)
    peers.choose(plugin, "heldout", None, without, False, imports=on_gpu)
    # every declared held-out peer, and the op as shipped where the problem has one (never a peer of the table)
    timed = [p.baseline for p in peers.for_shapes(plugin, "heldout")]
    timed += [peers.OWN_OP] if peers.OWN_OP in plugin.baselines else []
    parts: list[dict[str, Any]] = []

    before = {d: part for part in (earlier or {}).get("parts", []) for d in peers.dtypes_of(part)}
    done = {(r["dtype"], tuple(r["shape"])) for part in before.values() for r in part["rows"]}

    def keep(partial: dict[str, Any]) -> None:
        write_bench(bench_suite.join([*parts, partial], [f"held-out {d}" for d in dtypes]), out)

    def go_on(dtype: str, part: dict[str, Any]) -> dict[str, Any]:
        return continued(before[dtype], part, sum(c.dtype == dtype for c in cases)) if dtype in before else part

    for dtype in dtypes:
        todo = [c for c in cases if c.dtype == dtype and (c.dtype, c.shape) not in done]
        if not todo:
            parts.append(before[dtype])
            continue
        shapes = ",".join("x".join(map(str, c.shape)) for c in todo)
        parts.append(go_on(dtype, bench.run(problem, {"table": str(table)}, shapes, [dtype], timed, reps, 1, 30.0,
                                            on_row=lambda p, d=dtype: keep(go_on(d, p)), without=without)))
    return bench_suite.join(parts, [f"held-out {d}" for d in dtypes])


def continued(first: Mapping[str, Any], then: Mapping[str, Any], total: int) -> dict[str, Any]:
    """One dtype's bench cut short (`first`) and the bench of the cases it lacked (`then`) as one part: every row
    as measured (each row's providers side by side in one process), `continued` naming the later bench's date."""
    part = {**first, "rows": [*first["rows"], *then["rows"]], "wall_s": first.get("wall_s", 0) + then.get("wall_s", 0),
            "continued": then.get("fingerprint", {}).get("date", "?")}
    part.pop("partial", None)
    if len(part["rows"]) < total:
        part["partial"] = f"{len(part['rows'])} of {total} cases"
    part["ran"] = {d: list(peers.account(part, d).ran) for d in peers.dtypes_of(part)}
    return part


def check_peers(problem: Problem, without: Sequence[str]) -> None:
    """Before a campaign's searches, on a GPU: every held-out peer not left out loads (else one line and exit 2)."""
    from ..evaluate.gpu import gpu_unavailable_reason
    without = peers.parse_without(problem, without, "config key 'workload.without'")
    if gpu_unavailable_reason() is None:
        peers.choose(problem, "heldout", None, without, False, how="-o 'workload.without=[{}]'")


def validate(cfg: RunConfig, folder: Path, p: Any, without: Sequence[str] = ()) -> list[str]:
    """Step 5 of a campaign: bench on a GPU and write the report; elsewhere, say how to run it."""
    from ..evaluate.gpu import gpu_unavailable_reason
    reason = gpu_unavailable_reason()
    if reason:
        print(f"workload: the held-out bench needs a GPU ({reason}); run `kernel-factory heldout {folder}` on "
              f"one", file=sys.stderr)
        return []
    result = bench_heldout(cfg.problem, folder / "kernels" / "dispatch.json", p.split.heldout, folder / BENCH,
                           without=without)
    return write(result, cfg.problem, folder)


def write(result: Mapping[str, Any], problem: str, folder: Path) -> list[str]:
    lines, md = summarize(result, problem)
    write_bench(result, folder / BENCH)
    (folder / REPORT).write_text(md)
    print("\n".join(lines))
    return lines


def recorded(folder: str | Path, asked_by: str = "heldout") -> Path:
    """A folder's recorded held-out bench (BENCH, or BENCH.xz as committed); asked_by names the option in the error."""
    found = [p for p in (Path(folder) / BENCH, Path(folder) / (BENCH + ".xz")) if p.is_file()]
    if not found:
        raise ConfigError(f"{asked_by}: {str(folder)!r} holds no {BENCH} (or {BENCH}.xz)")
    return found[0]


def against(result: Mapping[str, Any], earlier: str | Path) -> str:
    """compared-<earlier folder's name>.md: each row's ratio to the best peer in this bench and in the earlier one
    on the same shapes, and each provider's time now over then apart by its earlier host path (bench_compare)."""
    from . import bench_compare
    cmp = bench_compare.compare(result, read_bench(recorded(earlier, "heldout --against")), Path(earlier).name)
    return "\n".join(bench_compare.section(cmp)).lstrip("\n") + "\n"


def main_heldout(folder: str, from_json: str | None, without: Sequence[str] = (), out: str | None = None,
                 go_on: bool = False, against_folder: str | None = None) -> int:
    """`kernel-factory heldout FOLDER [--from BENCH.json [--out DIR] [--against EARLIER]] [--go-on]
    [--without PEER,...]`: exit 2 when a peer asked for ran on no shape of a dtype (after the report is written)."""
    if out and not from_json:
        raise ConfigError("heldout --out goes with --from (a bench writes its report into the campaign folder)")
    if against_folder and not from_json:
        raise ConfigError("heldout --against goes with --from (it compares a recorded bench with an earlier one)")
    if go_on and from_json:
        raise ConfigError("heldout --go-on benches what the folder's bench lacks; --from only re-renders: give one")
    path = Path(folder)
    plan_file = path / "workload.json"
    if not plan_file.is_file():
        raise ConfigError(f"heldout: {folder!r} is not a workload campaign folder (no workload.json)")
    plan = json.loads(plan_file.read_text())
    problem = plan["config"]["problem"]
    peers.parse_without(registry.load("problem", problem), without)
    if from_json:
        try:
            result = read_bench(from_json)
        except (OSError, ValueError, lzma.LZMAError) as exc:
            raise ConfigError(f"heldout --from {from_json!r}: {exc}") from None
        lines, md = summarize(result, problem)
        print(md if not lines else "\n".join(lines))
        compared = against(result, against_folder) if against_folder else None
        if compared and not out:
            print(compared)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / REPORT).write_text(md)
            if compared:
                (Path(out) / f"compared-{Path(against_folder).name}.md").write_text(compared)
        return 0
    earlier = read_bench(recorded(folder, "heldout --go-on")) if go_on else None
    result = bench_heldout(problem, path / "kernels" / "dispatch.json", [Case.parse(k) for k in plan["heldout"]],
                           path / BENCH, without=without, earlier=earlier)
    write(result, problem, path)
    missing = [m for part in result["parts"] for m in peers.not_run(part)]
    if missing:
        from .bench_command import not_run_line
        print(not_run_line(missing), file=sys.stderr)
        return 2
    return 0
