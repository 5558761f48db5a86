"""`kernel-factory new NAME`: scaffold a problem plugin package (entry point, reference, inputs, shape sets,
tolerances, a template with two genes and its genes header, a record and a run config, a README and a test) that
passes `kernel-factory check` as generated. The files' text is in scaffold_files.py."""
from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path
from string import Template
from types import ModuleType

from .. import registry
from ..config import ConfigError
from ..evaluate import render
from ..protocols import Problem
from . import scaffold_files as files

NAME = re.compile(r"[a-z][a-z0-9_]*")


def package_name(name: str) -> str:
    return f"kf_{name}"


def check_name(name: str) -> None:
    """A problem name is the entry point's, the kernel's and a C macro prefix: lower-case letters, digits and _."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name) or len(name) > 48:
        raise ConfigError(f"problem name {name!r} is not valid: use lower-case letters, digits and _, starting with a "
                          "letter (it names the entry point, the package, the kernel and the genes header)")
    if name in registry.available("problem"):
        raise ConfigError(f"a problem named {name!r} is installed already; choose another name")


def layout(name: str) -> dict[str, str]:
    """Relative path -> text of every file the scaffold writes except the genes header."""
    pkg = package_name(name)
    values = {"name": name, "pkg": pkg, "dist": f"kf-{name.replace('_', '-')}"}
    sub = {f"{pkg}/problem.py": files.PROBLEM, f"{pkg}/__init__.py": files.INIT, f"{pkg}/{name}.cu": files.TEMPLATE,
           f"{pkg}/recorded/README.md": files.RECORDED_README, "pyproject.toml": files.PYPROJECT,
           "README.md": files.README, "record.yaml": files.RECORD_CONFIG, "run.yaml": files.RUN_CONFIG,
           f"tests/test_{name}_plugin.py": files.TEST, ".gitignore": files.GITIGNORE}
    return {path: Template(text).substitute(values) for path, text in sub.items()}


def load(folder: str | Path, name: str) -> Problem:
    """The problem object of a scaffolded (or any) plugin folder, imported from its source without installing it:
    what `new` writes the genes header from, and what a test checks."""
    pkg = package_name(name)
    path = Path(folder) / pkg / "problem.py"
    module_name = f"{pkg}.problem"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    parent = ModuleType(pkg)
    parent.__path__ = [str(path.parent)]   # type: ignore[attr-defined]
    sys.modules.setdefault(pkg, parent)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module.problem


def scaffold(name: str, parent: str | Path = ".") -> Path:
    """Write the plugin package NAME into parent/kf_NAME (which must not exist yet); returns that folder."""
    check_name(name)
    root = Path(parent) / package_name(name)
    if root.exists():
        raise ConfigError(f"{str(root)!r} exists already; choose another --dir or name (nothing was written)")
    blocker = next((p for p in (Path(parent), *Path(parent).parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"--dir {str(parent)!r}: {str(blocker)!r} is a file, not a folder")
    for rel, text in layout(name).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    problem = load(root, name)
    (root / package_name(name) / render.header_name(problem)).write_text(render.genes_header(problem))
    return root


def next_steps(root: Path, name: str) -> str:
    return "\n".join([
        f"wrote {root}/ ({', '.join(sorted(layout(name)))}, {package_name(name)}/{name}_genes.cuh)",
        "next:",
        f"  pip install --no-deps -e {root}",
        f"  kernel-factory check {name}",
        f"  edit {root}/{package_name(name)}/problem.py and {name}.cu; after changing the gene space: "
        f"kernel-factory genes {name}",
        f"  on a GPU host: kernel-factory record {root}/record.yaml --out "
        f"{root}/{package_name(name)}/recorded/{name}-bfloat16-h200.jsonl.gz",
        f"  kernel-factory run {root}/run.yaml",
        "the rules, with an example of each optional hook: docs/adding-a-problem.md"])
