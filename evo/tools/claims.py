"""The claims check: every number a page states must stand on the committed raw line it cites, in the order it is
written, so that a mistyped, stale or swapped figure fails a CPU test instead of reaching a reader.

The rule (docs/results/README.md says it for writers):
- A claim is a sentence (of a paragraph or a list item), a table row, or the text of a link to a raw file.
- A claim cites the raw files (under RAW_ROOTS) that it links. A claim that links none is cited by its block's
  links (a block is the text between blank lines); a table that links none, by the block right above it (its
  caption). A link may name lines, as GitHub's file view does (`bench.md#L21`, `gap.md#L5-L13`); a link without
  lines cites every line of the file.
- The numbers of a claim, in the order written, must stand one after another on one cited line: each as written,
  or as the line's number rounded to the digits written (0.970 matches 0.9704, not 0.97). Signs are ignored.
- A claim that cites nothing holds no number.
- Not numbers, on a page and in a raw file alike: code spans and URLs (on a page), digits inside words (bf16, H200,
  sm_90a), dotted versions (0.6.5) and dates (2026-12-02). Fenced code is not read; a heading is a block of its
  own, whose section number ("## 3. ") is not a number.
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
_DATE = re.compile(r"(?<![\w.])\d{4}-\d\d-\d\d(?:T\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)?(?!\w|\.\d)")
# a number standing alone (not inside a word or a dotted version); 32768x256 is two numbers, 1e-3 is one
_NUMBER = re.compile(r"(?:(?<![\w.])|(?<=\dx))(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?=x\b|x\d|[^\w.]|\.(?!\d)|$)")
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+", re.M)
_SENTENCE_END = re.compile(r"[.!?](?=\s)")
_LINES = re.compile(r"L(\d+)(?:-L(\d+))?$")
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+\d+(?:\.\d+)*\.)?(?:\s+|$)")


def numbers(text: str) -> list[str]:
    """The numbers of a text, in order, as written (dates left out)."""
    return [m.group(1) for m in _NUMBER.finditer(_DATE.sub(lambda m: " " * len(m.group(0)), text))]


def blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each block between blank lines and fenced code; a heading is a block of its
    own, its marks and section number ("## 3. ") blanked."""
    out, current, start, fenced = [], [], 0, False
    for i, line in enumerate(text.splitlines(), 1):
        fence = line.lstrip().startswith("```")
        fenced ^= fence
        heading = _HEADING.match(line) if not fenced else None
        if fence or fenced or not line.strip() or heading:
            if current:
                out.append((start, "\n".join(current)))
            current = []
            if heading:
                out.append((i, " " * heading.end() + line[heading.end():]))
            continue
        if not current:
            start = i
        current.append(line)
    if current:
        out.append((start, "\n".join(current)))
    return out


@dataclass(frozen=True)
class Cited:
    path: Path
    lines: tuple[int, int] | None = None   # first and last line cited (1-based), or the whole file

    def __str__(self) -> str:
        if not self.lines:
            return str(self.path)
        first, last = self.lines
        return f"{self.path}#L{first}" + (f"-L{last}" if last != first else "")


def cited_by(target: str, base: Path, root: Path) -> Cited | None:
    """The raw file (and lines) a link target names, or None (a URL, a folder, a page outside RAW_ROOTS)."""
    if "://" in target:
        return None
    name, _, fragment = target.partition("#")
    path = Path(os.path.abspath(base / name))   # no symlinks to follow: abspath, not resolve (fast)
    top = Path(os.path.abspath(root))
    if not any(path.is_relative_to(top / r) for r in RAW_ROOTS) or path.is_dir():
        return None
    m = _LINES.match(fragment)
    return Cited(path.relative_to(top), (int(m.group(1)), int(m.group(2) or m.group(1))) if m else None)


def citations(block: str, base: Path, root: Path) -> list[Cited]:
    """The raw files a block links."""
    return [c for _, t in _LINK.findall(block) if (c := cited_by(t, base, root))]


@dataclass(frozen=True)
class Claim:
    line: int                           # the page line it starts on
    numbers: tuple[str, ...]            # in the order written
    spans: tuple[tuple[int, int], ...]  # where each number is, as offsets into the page's text
    cited: tuple[Cited, ...]            # empty: it cites nothing


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """The text with each span replaced by as many spaces (offsets stay put)."""
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


def _units(masked: str, is_table: bool, items: list[int], links: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, end) of each sentence, list item (items: where each starts) or table row of a block."""
    if is_table:
        cuts = [m.start() for m in re.finditer(r"^", masked, re.M)]
    else:
        inside = lambda i: any(a <= i < b for a, b in links)
        cuts = [0, *items, *(m.end() for m in _SENTENCE_END.finditer(masked) if not inside(m.start()))]
    cuts = sorted(set(cuts) | {len(masked)})
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if masked[a:b].strip()]


def _found(masked: str, a: int, b: int, offset: int) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    text = _DATE.sub(lambda m: " " * len(m.group(0)), masked[a:b])
    found = [(m.group(1), (offset + a + m.start(1), offset + a + m.end(1))) for m in _NUMBER.finditer(text)]
    return tuple(n for n, _ in found), tuple(s for _, s in found)


def block_claims(block: str, offset: int, line: int, base: Path, root: Path,
                 caption: tuple[Cited, ...]) -> tuple[list[Claim], tuple[Cited, ...]]:
    """The claims of one block (offset: where the block starts in the page) and the citations a table below it
    would take as its caption's."""
    masked = _blank(block, [m.span() for m in _CODE.finditer(block)])
    links = [(m, cited_by(m.group(2), base, root)) for m in _LINK.finditer(masked)]
    masked = _blank(masked, [(m.end(1), m.end()) for m, _ in links])             # link targets say nothing
    masked = _blank(masked, [m.span() for m in _URL.finditer(masked)])
    items = [m.span() for m in _LIST_ITEM.finditer(masked)]
    masked = _blank(masked, items)   # the "1. " of a numbered list is no claim
    is_table = block.lstrip().startswith("|")
    own = tuple(c for _, c in links if c)
    whole = own or (caption if is_table else ())
    at = lambda i: line + block.count("\n", 0, i)
    out = []
    for a, b in _units(masked, is_table, [a for a, _ in items], [m.span() for m, _ in links]):
        inner = [(m, c) for m, c in links if a <= m.start() < b]
        rest = masked
        for m, c in inner:   # the text of a raw link is a claim about that link's lines alone
            nums, spans = _found(masked, m.start(1), m.end(1), offset)
            if c and nums:
                out.append(Claim(at(m.start()), nums, spans, (c,)))
                rest = _blank(rest, [m.span(1)])
        nums, spans = _found(rest, a, b, offset)
        if nums:
            out.append(Claim(at(a + len(rest[a:b]) - len(rest[a:b].lstrip())), nums, spans,
                             tuple(c for _, c in inner if c) or whole))
    return out, whole


def claims(text: str, base: Path, root: Path) -> list[Claim]:
    """Every claim of a page, in order. base: the page's folder, for its links."""
    starts = [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n")]
    out, above = [], ()
    for line, block in blocks(text):
        found, above = block_claims(block, starts[line - 1], line, base, root, above)
        out += found
    return out


@lru_cache(maxsize=64)
def _text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")


@lru_cache(maxsize=256)
def _rounded(path: Path, digits: int) -> tuple[tuple[str | None, ...], ...]:
    """Each line's numbers rounded to `digits` decimals; None where the file wrote fewer (a page may round a raw
    number, never claim digits the file does not have: 0.97 in the file is not 0.970 on the page)."""
    def rounded(n: str) -> str | None:
        enough = "e" in n.lower() or len(n.partition(".")[2]) >= digits
        return f"{abs(float(n)):.{digits}f}" if enough else None
    return tuple(tuple(rounded(n) for n in numbers(line)) for line in _text(path).splitlines())


@lru_cache(maxsize=256)
def _where(path: Path, digits: int) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each rounded number of a file -> every (line index, position in the line) that holds it."""
    found: dict[str, list[tuple[int, int]]] = {}
    for i, line in enumerate(_rounded(path, digits)):
        for j, n in enumerate(line):
            if n is not None:
                found.setdefault(n, []).append((i, j))
    return {n: tuple(at) for n, at in found.items()}


def _ranges(claim: Claim, root: Path) -> list[tuple[Path, int, int]]:
    """(file, first, last line index) of what the claim cites; files that do not exist are left out."""
    top = Path(os.path.abspath(root))
    out = []
    for cited in (c for c in claim.cited if (top / c.path).is_file()):
        first, last = cited.lines or (1, len(_rounded(top / cited.path, 0)))
        out.append((top / cited.path, first - 1, last - 1))
    return out


def cited_lines(claim: Claim, root: Path) -> list[tuple[Path, int]]:
    """(file, 0-based line index) of every line the claim cites."""
    return [(path, i) for path, first, last in _ranges(claim, root)
            for i in range(first, min(last + 1, len(_rounded(path, 0))))]


def standing(claim: Claim, root: Path) -> list[tuple[Path, int]]:
    """The cited lines on which the claim's numbers stand one after another, in order."""
    digits = [0 if "e" in n.lower() else len(n.partition(".")[2]) for n in claim.numbers]
    want = [f"{abs(float(n)):.{d}f}" for n, d in zip(claim.numbers, digits)]
    out = []
    for path, first, last in _ranges(claim, root):
        rows = [_rounded(path, d) for d in digits]
        found = {i for i, j in _where(path, digits[0]).get(want[0], ())
                 if first <= i <= last and j + len(want) <= len(rows[0][i])
                 and all(rows[p][i][j + p] == w for p, w in enumerate(want))}
        out += [(path, i) for i in sorted(found)]
    return out


def holds(claim: Claim, root: Path) -> bool:
    """Whether the claim's numbers stand one after another, in order, on one line it cites."""
    return bool(standing(claim, root))


def check_text(text: str, base: Path, root: Path, name: str = "page") -> list[str]:
    """Every broken claim of one page, one line each (empty: all hold)."""
    problems = []
    for line, block in blocks(text):
        for target in (t for _, t in _LINK.findall(block) if "://" not in t):
            if not (base / target.split("#")[0]).exists():
                problems.append(f"{name}:{line}: links {target}, which does not exist")
    for c in claims(text, base, root):
        if not c.cited:
            problems.append(f"{name}:{c.line}: {', '.join(c.numbers)} cite{'s' * (len(c.numbers) == 1)} no raw "
                            "file (link the raw line; a config value, a count in code or a version goes in a code "
                            "span)")
        elif not holds(c, root):
            what = " ".join(c.numbers)
            problems.append(f"{name}:{c.line}: {what} {'does' if len(c.numbers) == 1 else 'do'} not stand "
                            f"{'' if len(c.numbers) == 1 else 'one after another '}on one line of "
                            f"{', '.join(map(str, c.cited))}")
    return problems


def check(page: str | Path, root: str | Path = ".") -> list[str]:
    page, root = Path(page), Path(root)
    return check_text(page.read_text(), page.parent, root, str(page))
