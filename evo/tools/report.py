"""`kernel-factory report`: the results page (docs/results.md), generated from the committed raw results under
docs/results/ by the tools' own readers (gap, bench_report, faults), so that the page can say nothing the files do
not. A CPU test regenerates it and compares; another checks every number on it against the file it links.

To add a result: commit its raw file under docs/results/ and add one entry to BENCHES (a bench JSON, with the
markdown `kernel-factory bench --from` renders beside it) or one Section to SECTIONS (anything else).
Run from the repository root: the paths below are relative to it."""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

from . import bench_report, bench_suite, faults, gap

OUT = "docs/results.md"
RESULTS = "docs/results"
TARGETS = "configs/targets/rmsnorm-h200.yaml"
GAP = f"{RESULTS}/gap/rmsnorm-h200"
GAP_COMMAND = f"kernel-factory gap {TARGETS} --out {RESULTS}/gap --stem rmsnorm-h200"
FAULTS = f"{RESULTS}/faults/faults.json"
FAULTS_MD = f"{RESULTS}/faults/faults.md"   # faults.table() of FAULTS, as the faults command printed it


@dataclass(frozen=True)
class Bench:
    label: str       # what was benched, in a word or three
    json: str        # bench.py's JSON, as `kernel-factory bench --out` wrote it
    command: str     # the command that timed it


# One paragraph each on the page. The .md beside each JSON (`kernel-factory bench --from X.json --out DIR`) holds the
# geomeans as text, and its lines are what the page links for them (the claims check reads those lines).
BENCHES: tuple[Bench, ...] = (
    Bench("forward bf16", f"{RESULTS}/bench/fwd-bf16.json",
          "kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 "
          "--reps 20"),
    Bench("forward fp16, fp32", f"{RESULTS}/bench/fwd-fp16-fp32.json",
          "kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 "
          "--reps 20 --baselines int21,quack,liger,torch_eager,torch_compile"),
    Bench("backward bf16, fp16", f"{RESULTS}/bench/bwd.json",
          "kernel-factory bench --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 "
          "--reps 20 --baselines int21,quack,liger,torch_eager,torch_compile"),
    Bench("forward bf16 against torch.compile, compiled per shape", f"{RESULTS}/bench/fwd-compile.json",
          "kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes bfloat16 "
          "--baselines torch_compile,torch_eager --reps 20"),
    Bench("forward fp16, fp32 against torch.compile, compiled per shape",
          f"{RESULTS}/bench/fwd-compile-fp16-fp32.json",
          "kernel-factory bench --problem rmsnorm_fwd --table kernels/ops/rmsnorm_fwd.json --dtypes float16,float32 "
          "--baselines torch_compile,torch_eager --reps 20"),
    Bench("backward bf16, fp16 against torch.compile, compiled per shape", f"{RESULTS}/bench/bwd-compile.json",
          "kernel-factory bench --problem rmsnorm_bwd --table kernels/ops/rmsnorm_bwd.json --dtypes bfloat16,float16 "
          "--baselines torch_compile,torch_eager --reps 20"),
)


@dataclass(frozen=True)
class Section:
    title: str
    render: Callable[[], list[str]]   # the section's markdown lines, read from its raw files


def link(path: str, lines: tuple[int, int] | None = None, text: str | None = None, from_root: bool = False) -> str:
    """A markdown link to a file given from the repository root, from docs/ (or from the root), optionally to some
    of its lines (GitHub's #La-Lb): the claims check then looks for the numbers in those lines alone."""
    target = path if from_root else Path(path).relative_to("docs").as_posix()
    anchor = "" if not lines else f"#L{lines[0]}" + (f"-L{lines[1]}" if lines[1] != lines[0] else "")
    return f"[{text or Path(path).name}]({target}{anchor})"


def line_of(path: str, start: str, after: int = 0) -> int:
    """The number (1-based) of the first line of a file that starts with `start`, after line `after`."""
    for i, line in enumerate(Path(path).read_text().splitlines()[after:], after + 1):
        if line.startswith(start):
            return i
    raise ValueError(f"{path}: no line starting {start!r} after line {after}: regenerate it with its command")


def gap_analysis() -> dict[str, Any]:
    """The gap analysis of TARGETS, made once per process while the files it reads stay as they are (it reads every
    run journal: seconds). Callers read it and never change it."""
    files = [Path(TARGETS), *sorted(Path(RESULTS).glob("**/*.json")), *sorted(Path(RESULTS).glob("journals/**/*"))]
    return _gap_analysis((os.getcwd(), *((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files
                                         if p.is_file())))


@lru_cache(maxsize=4)
def _gap_analysis(files: tuple) -> dict[str, Any]:
    return gap.analyse(gap.load_targets(TARGETS))


def targets_table(from_root: bool = False) -> list[str]:
    """Each target against its side-by-side bench: the gap report's summary rows, each linking the row it copies.
    The README copies this table (from_root=True; a test keeps the copy true)."""
    analysis = gap_analysis()
    rows = []
    for rep in analysis["reports"]:
        at = line_of(GAP + ".md", f"| {rep['name']} (")
        rows.append(gap.summary_row(rep, link(GAP + ".md", (at, at), rep["name"], from_root)))
    return [*gap.SUMMARY, *rows]


def best_peers() -> str:
    """Which peers each report's best peer is the fastest of, from the gap analysis (the peers its bench ran)."""
    said = [f"{', '.join(rep['peers'])} ({rep['name']}{'; ' + rep['note'] if rep.get('note') else ''})"
            for rep in gap_analysis()["reports"]]
    return "; ".join(said)


def section_targets() -> list[str]:
    return [f"Raw: {link(GAP + '.json')} (the analysis), {link(GAP + '.md')} (every row); "
            f"command: `{GAP_COMMAND}`. Ratio = best peer µs / ours, above one is faster; the best peer is the "
            f"fastest in each row, timed in the same process, of: {best_peers()}.", "",
            *targets_table(), "",
            f"The bench it reads, `{RESULTS}/bench/rmsnorm-h200.json`, joins the three side-by-side benches below "
            f"(`kernel-factory bench --from ... --out {RESULTS}/bench --stem rmsnorm-h200`)."]


def section_benches(benches: Sequence[Bench] = BENCHES) -> list[str]:
    lines = []
    for b in benches:
        result = bench_suite.read(b.json)
        means = dict(bench_report.geomeans(result))
        fp = result["fingerprint"]
        others = "; ".join(f"{label[3:]} {value:.3f}" for label, value in means.items()
                           if label != "vs best peer" and value is not None)
        md = str(Path(b.json).with_suffix(".md"))
        copy, mean = line_of(md, "Timing:"), line_of(md, "Geomean of the ratios")
        lines += [f"**{b.label}** ({link(md, (1, copy), fp.get('gpu', '?'))}, {str(fp.get('date', '?'))[:10]}; raw "
                  f"`{b.json}`; command: `{b.command}`). {link(md, (mean, mean), 'Geomean of baseline µs / ours')}: "
                  f"vs best peer **{bench_report.fmt(means['vs best peer'])}**; {others}. "
                  f"{link(md, (copy, copy), 'Copy bandwidth')} in the same process: {result['copy_gbps']:.0f} GB/s.",
                  ""]
    return lines + ["In the first three benches the torch.compile figures are not torch.compile's: that baseline "
                    "compiled one function for every shape and ran eager code past dynamo's recompile limit. The "
                    "last three benches re-measure it for every part and dtype with a compiled function per shape, "
                    "each call checked to have run compiled code: those are torch.compile's figures."]


def section_faults() -> list[str]:
    data = json.loads(Path(FAULTS).read_text())
    rows = [faults.Row(**{k: v for k, v in r.items() if k != "right"}) for r in data["rows"]]
    fp = data["fingerprint"]
    right = sum(r.right for r in rows)
    tally = line_of(FAULTS_MD, f"{right}/")
    return [f"Raw: `{FAULTS}`, rendered with each status's message in {link(FAULTS_MD, (1, tally - 2))}; command: "
            f"`kernel-factory faults --out {FAULTS}` on {fp.get('gpu', '?')}, {str(fp.get('date', '?'))[:10]}. One "
            "batch of deliberate faults with good kernels between them, in this order, through the real GPU "
            "evaluator:", "",
            "| # | fault | threads | expected | got | GPU s |", "|---|---|---|---|---|---|",
            *(f"| {i} | {r.fault} | {r.threads} | {r.expected} | {r.got}{'' if r.right else ' (WRONG)'} | "
              f"{r.gpu_s:.2f} |" for i, r in enumerate(rows, 1)), "",
            link(FAULTS_MD, (tally, tally), f"{right} of {len(rows)} got the expected status; the worker restarted "
                                            f"{data['restarts']} times") + "."]


# The search-efficiency reports (efficiency/<stem>.json and the .md rendered from it), whose tables the page copies.
EFFICIENCY = (("softmax forward", "search-efficiency-softmax-heldout"), ("RMSNorm forward", "search-efficiency"),
              ("RMSNorm forward, the loop at population `24`", "search-efficiency-population24"))


def section_efficiency() -> list[str]:
    lines = ["Distinct genomes each method evaluated until one reached the target (`0.99` x the recorded space's "
             "optimum), over seeds, replayed from H200 recordings (no GPU). The loop's search defaults were tuned on "
             "the RMSNorm forward recording: its tables are in-sample, and the softmax table is the held-out "
             "measure. Each report holds every method and seed, its command, its recording's sha256, and how Kernel "
             "Tuner's GA ran (its population per generation and the rule that stopped it).", ""]
    for label, stem in EFFICIENCY:
        md = f"{RESULTS}/efficiency/{stem}.md"
        data = json.loads(Path(md).with_suffix(".json").read_text())
        text = Path(md).read_text().splitlines()
        head = line_of(md, "| method |")
        table = list(itertools.takewhile(str.strip, text[head - 1:]))
        tuned = "the search settings were tuned on it (in-sample)" if data["in_sample"] else \
            "the search settings were not tuned on it (held out)"
        lines += [f"**{label}** ({data['dtype']}), recording `{data['recording']}`: {tuned}. "
                  f"{link(md, (head, head + len(table) - 1))}, command: `{data['command']}`.", "", *table, ""]
    return lines[:-1]


def section_more() -> list[str]:
    return ["- The recording the quickstart replays: [problems/recorded/](../problems/recorded/README.md).",
            "- The H200 run journals that `gap` reads: [results/journals/](results/journals/)."]


SECTIONS: tuple[Section, ...] = (
    Section("Targets: ours against the best peer", section_targets),
    Section("Side-by-side benches", section_benches),
    Section("The evaluator's fault suite", section_faults),
    Section("Search efficiency on recorded spaces", section_efficiency),
    Section("More raw results", section_more),
)


def page(sections: Sequence[Section] = SECTIONS) -> str:
    lines = ["# Results", "",
             "Generated by `kernel-factory report` from the committed raw files under `docs/results/`; do not edit "
             "by hand (a test regenerates it and compares). Every table and paragraph with a number links the raw "
             "file the number is in; [results/README.md](results/README.md) says what each file is and the "
             "command that made it. Nothing on this page was timed to write it.", ""]
    for s in sections:
        lines += [f"## {s.title}", "", *s.render(), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def write(out: str | Path = OUT) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page())
    return path
