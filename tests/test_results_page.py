"""The results are what the raw files say: docs/results.md is what `kernel-factory report` makes from the committed
raw files now; the README's table is the report's; every number on the README and the docs pages is in the raw file
(the lines) its block cites (the claims check), and a doctored copy with one mistyped number fails; the committed
results stay small, and runs/ commits nothing but its README."""
from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

from kernel_factory.evo.tools import claims, cli, report

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)   # the report's paths are the repository's


def test_the_committed_results_page_is_what_report_generates(at_root):
    assert (ROOT / report.OUT).read_text() == report.page(), "docs/results.md is stale: run `kernel-factory report`"


def test_the_readme_table_is_the_reports(at_root):
    readme = (ROOT / "README.md").read_text().splitlines()
    table = report.targets_table(from_root=True)
    start = readme.index(table[0])
    assert readme[start:start + len(table)] == table


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_number_is_in_the_raw_file_it_cites(page):
    assert claims.check(page, ROOT) == []


def checked_blocks(text: str, base: Path) -> list[tuple[str, str, list[tuple[int, str]]]]:
    """(caption, block, [(offset in the block, number)]) of every block the check reads numbers in: a block that
    cites, or a table (with the block above it, its caption); code spans and link targets left out."""
    found, above = [], ""
    for _, block in claims.blocks(text):
        caption, above = above, block
        if not claims.citations(block, base, ROOT) and not block.lstrip().startswith("|"):
            continue
        spans = [m.span() for m in re.finditer(r"`[^`]*`|\]\([^)]*\)", block)]
        numbers = [(m.start(1), m.group(1)) for m in claims._NUMBER.finditer(block)
                   if not any(a <= m.start() < b for a, b in spans)]
        found.append((caption, block, numbers))
    return found


def mistypes(number: str) -> list[str]:
    """The number with one digit changed, every way."""
    return [number[:i] + d + number[i + 1:] for i, c in enumerate(number) if c.isdigit() for d in "0123456789"
            if d != c]


@pytest.mark.parametrize("name", ["README.md", "docs/results.md"])
def test_a_mistyped_number_fails_the_check(name):
    """Every copy of the page with one number of three or more significant digits mistyped, every digit every way:
    at least 98% fail, each naming the mistyped number. The rest are numbers that the same cited lines also hold
    (two geomeans on one line of a bench report differ in their last digit): the check cannot tell them apart."""
    page = ROOT / name
    tried = caught = 0
    for caption, block, numbers in checked_blocks(page.read_text(), page.parent):
        for at, number in numbers:
            if len(number.replace(".", "").lstrip("0")) < 3:
                continue
            for wrong in mistypes(number):
                doctored = f"{caption}\n\n{block[:at]}{wrong}{block[at + len(number):]}\n"
                problems = claims.check_text(doctored, page.parent, ROOT, name)
                tried += 1
                caught += any(f" {wrong} is in none of" in p for p in problems)
    assert tried >= 150
    assert caught >= 0.98 * tried, (caught, tried)


def test_the_headline_typos_fail():
    """The README's headline geomean with two digits swapped, and a copy bandwidth mistyped on the results page."""
    readme = (ROOT / "README.md").read_text()
    assert "**0.970**" in readme
    assert claims.check_text(readme.replace("**0.970**", "**0.907**", 1), ROOT, ROOT)
    results = (ROOT / "docs/results.md").read_text()
    assert "4255 GB/s" in results
    assert claims.check_text(results.replace("4255 GB/s", "4525 GB/s", 1), ROOT / "docs", ROOT)


def test_an_uncited_measurement_a_missing_file_and_added_digits_fail():
    ratio = round(random.uniform(1.1, 1.9), 3)
    assert claims.check_text(f"The kernel is {ratio}× faster.\n", ROOT, ROOT) != []
    assert claims.check_text(f"The kernel is {ratio} faster.\n", ROOT, ROOT) == []   # no unit, no citation: prose
    assert claims.check_text("See [this](docs/results/nothing.json).\n", ROOT, ROOT) != []
    # a number the cited line holds passes; the same number with a digit more does not
    line = (ROOT / "docs/results/bench/bwd.md").read_text().splitlines()[4]
    held = re.search(r"copy bandwidth (\d+) GB/s", line).group(1)
    cite = "[bench](docs/results/bench/bwd.md#L5)"
    assert claims.check_text(f"Copy: {held} GB/s ({cite}).\n", ROOT, ROOT) == []
    assert claims.check_text(f"Copy: {held}.0 GB/s ({cite}).\n", ROOT, ROOT) != []
    assert claims.check_text(f"Copy: {int(held) + 1} GB/s ({cite}).\n", ROOT, ROOT) != []


def test_a_table_is_cited_by_its_caption_or_its_rows_own_links():
    gap_md = (ROOT / "docs/results/gap/rmsnorm-h200.md").read_text().splitlines()
    rows = [i for i, line in enumerate(gap_md, 1) if line.startswith("| ") and "⚠" in line]
    first, last = rows[0], rows[-1]   # the worst row of the first report, a row of the last
    ratio = lambda n: gap_md[n - 1].split("|")[4].split()[0]
    assert ratio(first) != ratio(last)
    caption = "Raw: [gap](docs/results/gap/rmsnorm-h200.json).\n\n"
    table = "| what | ratio |\n|---|---|\n"
    assert claims.check_text(caption + table + f"| worst | {ratio(first)} |\n", ROOT, ROOT) == []
    assert claims.check_text(table + f"| worst | {ratio(first)}× |\n", ROOT, ROOT) != []   # no caption: uncited
    # a row's own link narrows it to that line, which does not hold another row's number
    own = f"| [worst](docs/results/gap/rmsnorm-h200.md#L{first}) | "
    assert claims.check_text(caption + table + own + f"{ratio(first)} |\n", ROOT, ROOT) == []
    assert claims.check_text(caption + table + own + f"{ratio(last)} |\n", ROOT, ROOT) != []


def test_report_check_and_write(at_root, tmp_path):
    assert cli.main(["report", "--check"]) == 0   # the page is current and every number cited holds
    stale = tmp_path / "results.md"
    stale.write_text((ROOT / report.OUT).read_text().replace("0.970", "0.971", 1))
    assert cli.main(["report", "--check", "--out", str(stale)]) == 1
    assert cli.main(["report", "--out", str(stale)]) == 0
    assert stale.read_text() == (ROOT / report.OUT).read_text()   # the committed page is current (test above)


def test_report_away_from_the_repository_root_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "repository root" in err and "Traceback" not in err


def test_the_committed_results_are_small_and_runs_commits_only_its_readme():
    results = [p for p in (ROOT / "docs").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in results) <= 5 * 2**20
    tracked = subprocess.run(["git", "ls-files", "runs"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert tracked.stdout.split() == ["runs/README.md"]
