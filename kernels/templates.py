"""Access to the CUDA C++ templates shipped in this folder (works from a wheel and from an editable install).

A template may split its device helpers into headers beside it: a line `#include "NAME.cuh"` is replaced by that
file's text when the template is read, so a candidate's source is one self-contained text (NVRTC needs no include
path, and a header's every line counts in the candidate's hash, the compile cache's key and the dispatch table's
cubin check)."""
from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCAL_INCLUDE = re.compile(r'^#include "(?P<name>[\w.-]+\.cuh)"[ \t]*\n', re.MULTILINE)


class TemplateError(ValueError):
    """A template names a header that is not in this folder, or headers that include each other."""


def read(name: str, _within: tuple[str, ...] = ()) -> str:
    """The text of template `name` (e.g. "rmsnorm_fwd.cu"), its local headers inlined."""
    path = HERE / name
    if not path.is_file():
        raise TemplateError(f"template {_within[-1] if _within else name!r} needs {name!r}, which is not in {HERE}")
    if name in _within:
        raise TemplateError(f"headers include each other: {' -> '.join(_within + (name,))}")
    return LOCAL_INCLUDE.sub(lambda m: read(m["name"], _within + (name,)), path.read_text())
