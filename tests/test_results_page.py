"""The results are what the raw files say. Every committed report renders again from its raw file (docs/results.md
included), and a raw file changed by one number no longer does; every number on the README and the docs pages
stands, in order, on the raw line its claim cites (the claims check), and a copy of a page with one number
mistyped, or swapped for a number of another cited line, fails; a number that cites nothing fails unless it is in
a code span; the committed results stay small, and runs/ commits nothing but its README."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_factory.evo.tools import claims, cli, efficiency_report, heldout, rerender, report
from kernel_factory.evo.tools.bench import SUBJECT

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _reports() -> dict[str, rerender.Rendered]:
    """Every rendered report, listed from the repository root (its paths are the repository's) wherever pytest runs."""
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return {r.path: r for r in rerender.reports()}
    finally:
        os.chdir(here)


REPORTS = _reports()


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)   # the report's paths are the repository's


@pytest.mark.parametrize("path", sorted(REPORTS))
def test_every_report_renders_from_its_raw_file(path, at_root):
    r = REPORTS[path]
    assert r.committed(rerender.committed(path)) == r.render(), f"{path} is stale or its raw file was edited: " \
                                                                 f"`{r.command}`"


def test_every_committed_report_has_a_renderer():
    """Every .md and .csv under docs/results/ (but its README) is in rerender.reports()."""
    reports = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs/results").rglob("*")
               if p.suffix in (".md", ".csv") and p.name != "README.md"}
    assert reports and reports <= set(REPORTS), sorted(reports - set(REPORTS))


def test_the_readme_table_is_the_reports(at_root):
    readme = (ROOT / "README.md").read_text().splitlines()
    table = report.targets_table(from_root=True)
    start = readme.index(table[0])
    assert readme[start:start + len(table)] == table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_number_stands_on_the_raw_line_it_cites(page):
    assert claims.check(page, ROOT) == []


def test_numbers_are_read_alike_on_pages_and_in_raw_files():
    assert claims.numbers("worst 0.62x at 1x8192, bf16 on H200") == ["0.62", "1", "8192"]
    assert claims.numbers("rtol 1e-3 at 32768x256; 0.6.5 on 2026-12-02T10:00:00+00:00.") == ["1e-3", "32768", "256"]
    assert claims.numbers("geomean 0.970 (target 1.05).") == ["0.970", "1.05"]


def _fails(text: str, base: Path, span: tuple[int, int], number: str) -> bool:
    """Whether the check fails on the page with `number` written at `span`. Only the block holding the span is
    checked, with the block above it (its caption, if it is a table): the rest of the page holds (test above)."""
    starts = [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n")]
    found = [(starts[line - 1], block) for line, block in claims.blocks(text)]
    k = next(i for i, (at, block) in enumerate(found) if at <= span[0] < at + len(block))
    at, block = found[k]
    doctored = block[:span[0] - at] + number + block[span[1] - at:]
    return claims.check_text((found[k - 1][1] + "\n\n" if k else "") + doctored + "\n", base, ROOT) != []


def _held(claim: claims.Claim, digits: int, lines: list[tuple[Path, int]]) -> set[str]:
    """The numbers of these lines (of the claim's cited lines), rounded to `digits` where written with as many."""
    return {n for path, i in lines for n in claims._rounded(path, digits)[i] if n}


def _digits(number: str) -> int:
    return 0 if "e" in number.lower() else len(number.partition(".")[2])


def _mutants(page: Path):
    """(claim, span of one of its numbers, that number) for every cited number of the page."""
    text = page.read_text()
    for c in claims.claims(text, page.parent, ROOT):
        if c.cited:
            yield from ((c, span, number) for number, span in zip(c.numbers, c.spans))


def _copies_a_line(c: claims.Claim, span: tuple[int, int], number: str) -> bool:
    """Whether the claim with `number` at `span` is a copy of one of its cited lines: then the check cannot tell
    it from the line meant (it reads numbers, not words: two fault rows that differ only in their names)."""
    numbers = tuple(number if s == span else n for n, s in zip(c.numbers, c.spans))
    return claims.holds(claims.Claim(c.line, numbers, c.spans, c.cited), ROOT)


@pytest.mark.parametrize("name", ["README.md", "docs/results.md"])
def test_a_number_swapped_for_one_of_another_cited_line_fails(name):
    """Every cited number of the page, replaced by up to three numbers (a seeded sample) that another of its cited
    lines holds at the digits written and no line the claim stands on holds (1.07x -> 1.21x of the next line): the
    check fails every time, unless the claim has become a copy of another cited line (listed, and few)."""
    page = ROOT / name
    text, rng, tried, copies = page.read_text(), random.Random(20261202), 0, []
    for c, span, number in _mutants(page):
        own = set(claims.standing(c, ROOT))
        rest = [line for line in claims.cited_lines(c, ROOT) if line not in own]
        others = sorted(_held(c, _digits(number), rest) - _held(c, _digits(number), own))
        for other in rng.sample(others, min(3, len(others))):
            tried += 1
            if not _fails(text, page.parent, span, other):
                assert _copies_a_line(c, span, other), (name, c.line, number, other)
                copies.append((c.line, number, other))
    assert tried >= 30 and len(copies) <= 0.03 * tried, copies


@pytest.mark.parametrize("name", ["README.md", "docs/results.md"])
def test_a_changed_number_fails(name):
    """Every cited number of the page replaced by a new number (seeded, of the same digits, held by none of the
    lines it cites): the check fails every time."""
    page = ROOT / name
    text, rng, tried = page.read_text(), random.Random(name), 0
    for c, span, number in _mutants(page):
        digits = _digits(number)
        held = _held(c, digits, claims.cited_lines(c, ROOT))
        new, tries = number, 0
        while f"{abs(float(new)):.{digits}f}" in held or new == number:   # wider, until no cited line holds it
            tries += 1
            new = f"{(abs(float(number)) + 1) * rng.uniform(1.1, 3) * 10 ** (tries // 10):.{digits}f}"
        tried += 1
        assert _fails(text, page.parent, span, new), (name, c.line, number, new)
    assert tried >= 40


def mistypes(number: str) -> list[str]:
    """The number with one digit changed, every way (no leading zero, not the same value)."""
    out = [number[:i] + d + number[i + 1:] for i, ch in enumerate(number) if ch.isdigit()
           for d in "0123456789".replace(ch, "")]
    return [w for w in out if float(w) != float(number) and not re.match(r"0\d", w)]


@pytest.mark.parametrize("name", ["README.md", "docs/results.md"])
def test_a_mistyped_number_fails(name):
    """Every cited number of the page with one digit changed (a seeded sample of four ways each): the check fails,
    unless the typo makes the claim a copy of one of its cited lines (another number of the very line a one-number
    claim stands on; listed, and few)."""
    page = ROOT / name
    text, rng, tried, copies = page.read_text(), random.Random(name), 0, []
    for c, span, number in _mutants(page):
        typos = mistypes(number)
        for wrong in rng.sample(typos, min(4, len(typos))):
            tried += 1
            if not _fails(text, page.parent, span, wrong):
                assert _copies_a_line(c, span, wrong), (name, c.line, number, wrong)
                copies.append((c.line, number, wrong))
    assert tried >= 150 and len(copies) <= 0.03 * tried, copies


def test_the_issues_doctored_readme_lines_fail():
    """A changed number that another number of the cited lines matches: each used to pass, each fails now (the
    forward's earlier lines and the backward's stand on docs/workload.md)."""
    for page, old, new in [
            ("docs/workload.md", "fwd fp16: geomean 0.96x best peer", "fwd fp16: geomean 1.04x best peer"),
            ("docs/workload.md", "0.88x best peer over 48 shapes, worst 0.62x", "0.88x best peer over 47 shapes, worst 0.62x"),
            ("docs/workload.md", "vs best peer 0.935; vs quack", "vs best peer 0.954; vs quack"),
            ("docs/workload.md", "fwd bf16: geomean 1.06x over 48 shapes, worst", "fwd bf16: geomean 1.07x over 48 shapes, worst"),
            ("README.md", "**0.970** (1.05)", "**1.141** (1.05)"),
            ("README.md", "6 of 11 below 0.98", "7 of 11 below 0.98"),
            ("docs/workload.md", "worst 0.44x at 1702x159964", "worst 0.54x at 1702x159964"),
            ("docs/workload.md", "0.83x best peer over 48 shapes", "0.83x best peer over 47 shapes"),
            ("docs/workload.md", "bwd fp16: geomean 1.16x over 48", "bwd fp16: geomean 1.61x over 48"),
            ("docs/workload.md", "fwd bf16: geomean 0.94x over 48", "fwd bf16: geomean 1.03x over 48")]:
        text = (ROOT / page).read_text()
        assert text.count(old) == 1, old
        assert claims.check_text(text.replace(old, new), (ROOT / page).parent, ROOT) != [], new


def test_a_claim_that_cites_nothing_holds_no_number():
    ratio = f"{random.uniform(1.1, 1.9):.3f}"
    for line in [f"The kernel is {ratio}x faster.", f"It took {random.randint(12, 99)} evaluations.",
                 f"See [the guide](docs/workload.md): {ratio} of the peer.", f"## {ratio}x faster"]:
        assert claims.check_text(line + "\n", ROOT, ROOT) != [], line
    for line in [f"The quickstart is `{random.randint(2, 9)}` generations.", "Recorded on 2026-12-01 with QuACK 0.6.5.",
                 "It runs on H200 GPUs in bf16.", "```\nkernel-factory run --seeds 20\n```", "## 3. Buckets"]:
        assert claims.check_text(line + "\n", ROOT, ROOT) == [], line


def test_a_claim_with_links_of_its_own_is_checked_against_them_alone():
    """The bench's geomean line holds each geomean; the copy-bandwidth line holds the copy bandwidth. A sentence
    that links one line, or a link's text, is checked against that line alone, in the order written."""
    md = (ROOT / "docs/results/bench/bwd.md").read_text().splitlines()
    mean = next(i for i, line in enumerate(md, 1) if line.startswith("Geomean of the ratios"))
    values = re.findall(r"\d+\.\d+", md[mean - 1])
    copy = re.search(r"copy bandwidth (\d+) GB/s", md[4]).group(1)
    cite = f"docs/results/bench/bwd.md#L{mean}"
    assert claims.check_text(f"[Geomeans]({cite}): {values[0]}; {values[1]}.\n", ROOT, ROOT) == []
    assert claims.check_text(f"[Geomeans]({cite}): {values[1]}; {values[0]}.\n", ROOT, ROOT) != []   # order
    assert claims.check_text(f"[Geomeans]({cite}): {copy} GB/s.\n", ROOT, ROOT) != []   # another line's number
    assert claims.check_text(f"[{copy} GB/s](docs/results/bench/bwd.md#L5); [{values[0]}]({cite}).\n",
                             ROOT, ROOT) == []
    assert claims.check_text(f"[{copy}.0 GB/s](docs/results/bench/bwd.md#L5).\n", ROOT, ROOT) != []   # digits added
    assert claims.check_text("See [this](docs/results/nothing.json).\n", ROOT, ROOT) != []


def test_a_table_row_copies_a_raw_row():
    rows = [line for line in (ROOT / report.GAP).with_suffix(".md").read_text().splitlines()
            if line.startswith("| forward") or line.startswith("| backward")]
    caption = "Raw: [gap](docs/results/gap/rmsnorm-h200.md).\n\n"
    assert claims.check_text(caption + rows[0] + "\n", ROOT, ROOT) == []
    cells = rows[0].split("|")
    cells[3], cells[5] = cells[5], cells[3]   # two cells of one row swapped
    assert claims.check_text(caption + "|".join(cells) + "\n", ROOT, ROOT) != []
    assert claims.check_text(rows[0] + "\n", ROOT, ROOT) != []   # no caption: it cites nothing


# How to change one raw number of each kind of raw file so that its report must change (seeded: which row).
def _halve_ours(data: dict, rng: random.Random) -> None:
    """A bench row of ours made twice as fast (a bench JSON, a suite, a held-out bench)."""
    rows = [r for part in data.get("parts", [data]) for r in part["rows"] if "us" in r["providers"].get(SUBJECT, {})]
    rng.choice(rows)["providers"][SUBJECT]["us"] /= 2


def _one_more_evaluation(data: dict, rng: random.Random) -> None:
    """One seed of random search needing one evaluation more than it did (or one, where it found none)."""
    run = rng.choice(data["methods"]["random"])
    run["hit"] = (run["hit"] or 0) + 1


MUTATE = {
    "bench": _halve_ours,
    "heldout": _halve_ours,
    "percall": lambda d, rng: rng.choice([r for r in d["rows"] if "eager_us" in r]).__setitem__("eager_us", 1.5),
    "scaling": lambda d, rng: rng.choice(d["rows"]).__setitem__("wall_s", 0.5),
    "faults": lambda d, rng: rng.choice(d["rows"]).__setitem__("gpu_s", 9.87),
    "efficiency": _one_more_evaluation,
}


def _kind(r: rerender.Rendered) -> str:
    for kind in ("efficiency", "heldout", "percall", "scaling", "faults", "bench"):   # efficiency names hold "heldout"
        if kind in r.raw[0]:
            return kind
    return "gap" if "gap" in r.path else "page"


@pytest.fixture(scope="module")
def copy_of_results(tmp_path_factory):
    """docs/results/ and the targets file, copied: raw files there may be changed."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "docs/results", root / "docs/results")
    shutil.copytree(ROOT / "configs/targets", root / "configs/targets")
    shutil.copy(ROOT / report.OUT, root / report.OUT)
    return root


@pytest.mark.parametrize("path", [p for p in sorted(REPORTS) if _kind(REPORTS[p]) in MUTATE and p.endswith(".md")])
def test_a_raw_number_changed_no_longer_renders_the_committed_report(path, copy_of_results, monkeypatch):
    monkeypatch.chdir(copy_of_results)
    r = next(x for x in rerender.reports() if x.path == path)
    raw = Path(r.raw[0])
    before = raw.read_bytes()
    try:
        data = heldout.read_bench(raw)   # any raw JSON, xz-compressed where its name ends in .xz
        MUTATE[_kind(r)](data, random.Random(path))
        heldout.write_bench(data, raw)
        assert r.render() != r.committed(rerender.committed(ROOT / path))
    finally:
        raw.write_bytes(before)


def test_a_bench_row_changed_changes_the_gap_report_and_the_results_page(copy_of_results, monkeypatch):
    monkeypatch.chdir(copy_of_results)
    bench = Path(report.RESULTS) / "bench/rmsnorm-h200.json"
    before = bench.read_text()
    try:
        data = json.loads(before)
        _halve_ours(data, random.Random(7))
        bench.write_text(json.dumps(data, indent=1))
        stale = rerender.stale()
        assert any(line.startswith(report.GAP + ".md ") for line in stale), stale
        assert any(line.startswith(report.GAP + ".json ") for line in stale), stale
    finally:
        bench.write_text(before)


def test_efficiency_reports_say_their_problem_recording_and_command():
    found = sorted((ROOT / "docs/results/efficiency").glob("*.json"))
    assert len(found) >= 3
    for path in found:
        data = json.loads(path.read_text())
        text = efficiency_report.markdown(data)
        assert f"Problem `{data['problem']}`" in text and data["sha256"] in text and data["command"] in text
        assert ("in-sample" in text) == data["in_sample"]
        assert f"--recording {data['recording']}" in data["command"] and "--problem" in data["command"]


def test_report_check_and_write(at_root, tmp_path):
    assert cli.main(["report", "--check"]) == 0   # the page is current, every report renders, every claim holds
    stale = tmp_path / "results.md"
    stale.write_text((ROOT / report.OUT).read_text().replace("0.970", "0.971", 1))
    assert cli.main(["report", "--check", "--out", str(stale)]) == 1
    assert cli.main(["report", "--out", str(stale)]) == 0
    assert stale.read_text() == (ROOT / report.OUT).read_text()


def test_report_away_from_the_repository_root_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "repository root" in err and "Traceback" not in err


def test_the_committed_results_are_small_and_runs_commits_only_its_readme():
    results = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in results) <= 6 * 2**20
    tracked = subprocess.run(["git", "ls-files", "runs"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert tracked.stdout.split() == ["runs/README.md"]
