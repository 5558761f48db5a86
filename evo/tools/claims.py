"""The claims check: every number a results page states must be in the committed raw file it links, so that a
mistyped or stale figure fails a CPU test instead of reaching a reader.

The convention (docs/results/README.md says it for writers):
- A block is the text between blank lines: a paragraph, a list or a table. A table with no link of its own is
  cited by the block right above it (its caption).
- A block cites the raw files it links under RAW_ROOTS (paths relative to the page). A link may name lines, as
  GitHub's file view does (`bench.md#L21`, `gap.json#L5-L40`): then only those lines are cited. A table row with
  links of its own is cited by those alone.
- In a block that cites, every number must appear in a cited file: as written, or as a number of the file rounded
  to the digits written (0.970 matches 0.9704; 4255 GB/s matches 4255.3; but 0.970 does not match 0.97, which has
  fewer digits). Signs are ignored.
- A block that cites nothing may state no measurement: no number followed by ×, x, %, µs, us, ms, GB/s or TB/s.
- Not numbers: code spans, link targets, URLs, headings, digits inside words (bf16, H200, sm_90a) and dotted
  versions (0.6.5).
"""
from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

RAW_ROOTS = ("docs/results", "problems/recorded")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_CODE = re.compile(r"`[^`]*`")
_URL = re.compile(r"https?://\S+")
# a number standing alone: not inside a word or a dotted version; a trailing x (0.97x, 32768x256) is allowed
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?=x\b|x\d|[^\w.]|\.(?!\d)|$)")
_MEASURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:×|x\b|%|µs|us\b|ms\b|GB/s|TB/s)")
_RAW_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each block between blank lines, outside fenced code."""
    out, current, start, fenced = [], [], 0, False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.strip() or line.lstrip().startswith("#"):
            if current:
                out.append((start, "\n".join(current)))
            current = []
            continue
        if not current:
            start = i
        current.append(line)
    if current:
        out.append((start, "\n".join(current)))
    return out


_LINES = re.compile(r"L(\d+)(?:-L(\d+))?$")


@dataclass(frozen=True)
class Cited:
    path: Path
    lines: tuple[int, int] | None = None   # first and last line cited (1-based), or the whole file

    def __str__(self) -> str:
        if not self.lines:
            return str(self.path)
        first, last = self.lines
        return f"{self.path}#L{first}" + (f"-L{last}" if last != first else "")


def citations(block: str, base: Path, root: Path) -> list[Cited]:
    """The raw files a block links (folders and pages outside RAW_ROOTS are not citations)."""
    found = []
    for _, target in _LINK.findall(block):
        if "://" in target:
            continue
        name, _, fragment = target.partition("#")
        path = Path(os.path.abspath(base / name))   # no symlinks to follow: abspath, not resolve (fast)
        top = Path(os.path.abspath(root))
        if any(path.is_relative_to(top / r) for r in RAW_ROOTS) and not path.is_dir():
            m = _LINES.match(fragment)
            found.append(Cited(path.relative_to(top),
                               (int(m.group(1)), int(m.group(2) or m.group(1))) if m else None))
    return found


def prose(block: str) -> str:
    """The block without what holds no claims: code spans, link targets and URLs."""
    return _URL.sub(" ", _LINK.sub(lambda m: m.group(1), _CODE.sub(" ", block)))


@lru_cache(maxsize=64)
def _text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")


@lru_cache(maxsize=256)
def _rounded(cited: Cited, root: Path, digits: int) -> frozenset[str]:
    """The cited lines' numbers written with at least `digits` decimals, each rounded to `digits` (a page may round
    a raw number, never claim digits the file does not have: 0.97 in the file is not 0.970 on the page)."""
    text = _text(root / cited.path)
    if cited.lines:
        text = "\n".join(text.splitlines()[cited.lines[0] - 1:cited.lines[1]])
    return frozenset(f"{abs(float(n)):.{digits}f}" for n in _RAW_NUMBER.findall(text)
                     if "e" in n.lower() or len(n.partition(".")[2]) >= digits)


def found_in(number: str, cited: list[Cited], root: Path) -> bool:
    digits = len(number.split(".")[1]) if "." in number else 0
    want = f"{float(number):.{digits}f}"
    return any(want in _rounded(c, Path(os.path.abspath(root)), digits) for c in cited)


def check_text(text: str, base: Path, root: Path, name: str = "page") -> list[str]:
    """Every broken claim of one page, one line each (empty: all hold). base: the page's folder, for its links."""
    problems, above = [], []
    for line, block in blocks(text):
        for target in (t for _, t in _LINK.findall(block) if "://" not in t):
            if not (base / target.split("#")[0]).exists():
                problems.append(f"{name}:{line}: links {target}, which does not exist")
        cited = citations(block, base, root)
        is_table = block.lstrip().startswith("|")
        if is_table and not cited:
            cited = above
        above = cited
        # a table row with links of its own is cited by them alone; other rows and blocks by the whole block's
        parts = ([(line + i, row, citations(row, base, root) or cited) for i, row in enumerate(block.splitlines())]
                 if is_table else [(line, block, cited)])
        for at, words, by in ((at, prose(b), by) for at, b, by in parts):
            if not by:
                problems += [f"{name}:{at}: {m.group(0)!r} is a measurement with no raw file linked in its block"
                             for m in _MEASURE.finditer(words)]
                continue
            problems += [f"{name}:{at}: {m.group(1)} is in none of {', '.join(map(str, by))}"
                         for m in _NUMBER.finditer(words) if not found_in(m.group(1), by, root)]
    return problems


def check(page: str | Path, root: str | Path = ".") -> list[str]:
    page, root = Path(page), Path(root)
    return check_text(page.read_text(), page.parent, root, str(page))
