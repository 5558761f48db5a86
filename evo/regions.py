"""A template's editable regions and the code patches that replace them: pure text functions on floor 1, so that
operators (which write patches) and the engine (which renders and checks them) share one definition."""
from __future__ import annotations

import re
from typing import Mapping

REGION = re.compile(r"^[^\n]*KF-EDIT-BEGIN (\w+)[^\n]*\n(.*?)^[^\n]*KF-EDIT-END \1[^\n]*$", re.S | re.M)


class PatchError(ValueError):
    """A patch names a region the template does not have."""


def regions(template: str) -> dict[str, str]:
    """Editable region name -> its current body."""
    return {m.group(1): m.group(2) for m in REGION.finditer(template)}


def apply_patch(template: str, patch: Mapping[str, str]) -> str:
    """The template with each named region's body replaced (its marker lines kept)."""
    unknown = set(patch) - set(regions(template))
    if unknown:
        raise PatchError(f"patch names regions {sorted(unknown)}; the template has {sorted(regions(template))}")

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if name not in patch:
            return m.group(0)
        begin, end = m.group(0).split("\n", 1)[0], m.group(0).rsplit("\n", 1)[1]
        body = patch[name] if patch[name].endswith("\n") else patch[name] + "\n"
        return f"{begin}\n{body}{end}"

    return REGION.sub(replace, template)
