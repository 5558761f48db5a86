"""The reply format an LLM operator asks for, parsed and applied strictly: a reply names one editable region and
either SEARCH/REPLACE blocks whose SEARCH text occurs exactly once in that region, or one BODY block that replaces
the region whole. Anything else is an EditError, which the operator turns into an `invalid_patch` child."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Mapping

FORMAT = """\
REGION: <name of one editable region>
<<<<<<< SEARCH
<lines copied exactly from that region's current body>
=======
<the lines that replace them>
>>>>>>> REPLACE
(more SEARCH/REPLACE blocks for the same region may follow; they apply in order)

or, to replace the whole region body:

REGION: <name>
<<<<<<< BODY
<the complete new body of the region>
>>>>>>> BODY"""

_REGION = re.compile(r"^REGION:\s*(\S+)\s*$", re.M)
_MARKERS = {"<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE", "<<<<<<< BODY", ">>>>>>> BODY"}


class EditError(ValueError):
    """A reply that does not parse or does not apply; the message says exactly why."""


@dataclass(frozen=True)
class Edit:
    region: str
    blocks: tuple[tuple[str, str], ...]   # (search, replace) pairs; empty when body is set
    body: str | None = None               # a whole new region body


def parse(reply: str) -> Edit:
    regions = _REGION.findall(reply)
    if not regions:
        raise EditError("the reply has no 'REGION: <name>' line, so it holds no edit")
    if len(set(regions)) > 1:
        raise EditError(f"the reply edits several regions {sorted(set(regions))}; one region per reply")
    lines = reply[_REGION.search(reply).end():].split("\n")
    blocks, bodies, i = [], [], 0
    while i < len(lines):
        marker = lines[i].strip()
        if marker == "<<<<<<< SEARCH":
            search, i = _until(lines, i + 1, "=======")
            replace, i = _until(lines, i + 1, ">>>>>>> REPLACE")
            blocks.append((search, replace))
        elif marker == "<<<<<<< BODY":
            text, i = _until(lines, i + 1, ">>>>>>> BODY")
            bodies.append(text)
        elif marker in _MARKERS:
            raise EditError(f"marker {marker!r} on reply line {i + 1} is out of place")
        i += 1
    if not blocks and not bodies:
        raise EditError(f"the reply names region {regions[0]!r} but has no SEARCH/REPLACE or BODY block")
    if bodies and (blocks or len(bodies) > 1):
        raise EditError("a BODY block replaces the whole region, so it must be the reply's only block")
    return Edit(regions[0], tuple(blocks), bodies[0] if bodies else None)


def _until(lines: list[str], start: int, end: str) -> tuple[str, int]:
    for j in range(start, len(lines)):
        if lines[j].strip() == end:
            return "\n".join(lines[start:j]) + "\n", j
        if lines[j].strip() in _MARKERS:
            raise EditError(f"expected {end!r} before {lines[j].strip()!r} (reply line {j + 1})")
    raise EditError(f"a block is not closed: {end!r} is missing")


def apply(edit: Edit, current: Mapping[str, str]) -> str:
    """The region's new body, given every region's current body (the parent's patch over the template)."""
    if edit.region not in current:
        raise EditError(f"unknown region {edit.region!r}; the editable regions are {sorted(current)}")
    old = current[edit.region]
    new = edit.body if edit.body is not None else old
    for n, (search, replace) in enumerate(edit.blocks, 1):
        if not search.strip():
            raise EditError(f"SEARCH block {n} is empty")
        found = new.count(search)
        if found != 1:
            where = "does not occur" if found == 0 else f"occurs {found} times"
            raise EditError(f"SEARCH block {n} {where} in region {edit.region!r}; it must match exactly once, "
                            "character for character")
        new = new.replace(search, replace)
    if new.strip() == old.strip():
        raise EditError(f"the edit leaves region {edit.region!r} unchanged")
    return new


def diff(region: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{region}", f"b/{region}"))
