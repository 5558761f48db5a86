"""Every committed report that a command renders from a raw file, and that render done again: a test compares each
with the committed file, so that a raw file changed by hand, or a renderer changed without re-rendering, fails on
a CPU instead of leaving a report that its raw file no longer says. Run from the repository root."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import agreement, bench_report, bench_suite, efficiency_report, faults, gap, heldout, percall, report, scaling

RESULTS = Path(report.RESULTS)


@dataclass(frozen=True)
class Rendered:
    path: str                    # the committed report
    raw: tuple[str, ...]         # what it is rendered from (a test changes these and expects a different render)
    render: Callable[[], str]    # the report's text from the raw files as they are now
    command: str                 # what writes the report again from its raw files
    committed: Callable[[str], str] = lambda text: text   # the committed text, less what its raw file lacks


def _without_wall_line(text: str) -> str:
    """faults.md less its last line, the wall time the command printed: faults.json does not hold it."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:-1]) if lines and lines[-1].startswith("wall ") else text


def _bench(source: Path) -> list[Rendered]:
    def text(kind: str) -> str:
        result = bench_suite.read(source)
        render = bench_suite if result.get("format") == bench_suite.FORMAT else bench_report
        return render.markdown(result) if kind == "md" else render.to_csv(result)
    command = f"kernel-factory bench --from {source} --out {source.parent} --stem {source.stem}"
    return [Rendered(str(source.with_suffix(f".{kind}")), (str(source),), lambda kind=kind: text(kind), command)
            for kind in ("md", "csv") if source.with_suffix(f".{kind}").is_file()]


def _heldout(source: Path) -> Rendered:
    def text() -> str:
        problem = json.loads((source.parent / "workload.json").read_text())["config"]["problem"]
        return heldout.summarize(heldout.read_bench(source), problem)[1]
    return Rendered(str(source.parent / heldout.REPORT), (str(source),), text,
                    f"kernel-factory heldout {source.parent} --from {source} (the report: heldout.summarize)")


def _compared(path: Path) -> Rendered:
    """workload/NAME/compared-EARLIER.md: NAME's held-out bench against EARLIER's (a folder beside it)."""
    earlier = path.parent.parent / path.stem.removeprefix("compared-")
    source = heldout.recorded(path.parent)
    return Rendered(str(path), (str(source), str(heldout.recorded(earlier))),
                    lambda: heldout.against(heldout.read_bench(source), earlier),
                    f"kernel-factory heldout {path.parent} --from {source} --against {earlier} --out {path.parent}")


def _faults() -> Rendered:
    def text() -> str:
        data = json.loads(Path(report.FAULTS).read_text())
        rows = [faults.Row(**{k: v for k, v in r.items() if k != "right"}) for r in data["rows"]]
        return faults.table(rows, data["restarts"]) + "\n"
    return Rendered(report.FAULTS_MD, (report.FAULTS,), text, "faults.table() of faults.json", _without_wall_line)


def _percall(source: Path) -> Rendered:
    return Rendered(str(source.with_suffix(".md")), (str(source),),
                    lambda: percall.table(json.loads(source.read_text())),
                    f"python -m kernel_factory.evo.tools.percall --from {source}")


def _scaling(source: Path) -> Rendered:
    def text() -> str:
        data = json.loads(source.read_text())
        return scaling.markdown(data["rows"], data["command"])
    return Rendered(str(source.with_suffix(".md")), (str(source),), text, "scaling.markdown() of scaling.json")


def _efficiency(source: Path) -> Rendered:
    return Rendered(str(source.with_suffix(".md")), (str(source),),
                    lambda: efficiency_report.markdown(json.loads(source.read_text())),
                    f"python -m kernel_factory.evo.tools.efficiency --from {source} --out {source.with_suffix('.md')}")


def _agreement(source: Path) -> Rendered:
    def text() -> str:
        data = json.loads(source.read_text())
        return agreement.table(data["rows"], data["tolerance"])
    return Rendered(str(source.with_suffix(".md")), (str(source),), text,
                    f"python -m kernel_factory.evo.tools.agreement --from {source} --out {source.parent}")


def _gap() -> list[Rendered]:
    raw = (report.TARGETS,)   # and the benches and journals it names
    return [Rendered(report.GAP + ".md", raw, lambda: gap.markdown(report.gap_analysis()), report.GAP_COMMAND),
            Rendered(report.GAP + ".json", raw,
                     lambda: json.dumps(report.gap_analysis(), indent=1, default=str) + "\n", report.GAP_COMMAND)]


def reports() -> list[Rendered]:
    """Every rendered report under docs/results/, and the results page made from them."""
    out = [r for source in sorted(RESULTS.glob("**/bench/*.json")) for r in _bench(source)]
    out += [_heldout(s) for s in sorted([*RESULTS.glob("workload/*/" + heldout.BENCH),
                                         *RESULTS.glob("workload/*/" + heldout.BENCH + ".xz")])]
    out += [_compared(p) for p in sorted(RESULTS.glob("workload/*/compared-*.md"))]
    out += [_percall(s) for s in sorted(RESULTS.glob("op/*/percall.json"))]
    out += [_scaling(s) for s in sorted(RESULTS.glob("scaling/scaling.json"))]
    out += [_efficiency(s) for s in sorted(RESULTS.glob("efficiency/*.json"))]
    out += [_agreement(s) for s in sorted(RESULTS.glob("agreement/*/agreement.json"))]
    out += [_faults(), *_gap(), Rendered(report.OUT, (str(RESULTS),), report.page, "kernel-factory report")]
    return out


def stale(skip: tuple[str, ...] = ()) -> list[str]:
    """One line for each report (but those in skip) that its raw files no longer render to (empty: all current)."""
    return [f"{r.path} is not what its raw file renders to: `{r.command}`" for r in reports()
            if r.path not in skip and r.committed(committed(r.path)) != r.render()]


def committed(path: str | Path) -> str:
    """A committed report's text exactly, line endings included (a bench CSV ends its lines with CR LF)."""
    return Path(path).read_bytes().decode("utf-8")
