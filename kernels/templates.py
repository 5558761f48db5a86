"""Access to the CUDA C++ templates shipped in this folder (works from a wheel and from an editable install)."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def read(name: str) -> str:
    """The text of template `name` (e.g. "rmsnorm_fwd.cu")."""
    return (HERE / name).read_text()
