"""The floors, from the files alone: no import cycles anywhere in the package, and every module outside kernels/ sits
in exactly one layer of the import-linter contract in pyproject.toml, so that a new module cannot escape `lint-imports`
(kernels/ is held apart by a contract of its own, with a wildcard)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import networkx as nx
import pytest

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
LINTER = PYPROJECT["tool"]["importlinter"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*LINTER["root_packages"], cache_dir=None)


def ours(graph: grimp.ImportGraph) -> set[str]:
    # grimp names a namespace root (the card's folders have no __init__.py) after its path: those are not modules
    return {m for m in graph.modules if m.startswith("kernel_factory.")}


def test_no_import_cycles(graph):
    edges = nx.DiGraph((m, i) for m in ours(graph) for i in graph.find_modules_directly_imported_by(m))
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
    assert len(ours(graph)) > 50 and edges.number_of_edges() > 150   # the graph really was read from the files


def test_every_module_is_on_exactly_one_floor(graph):
    (floors,) = [c for c in LINTER["contracts"] if c["type"] == "layers"]
    layers = [{name.strip() for name in layer.split(":")} for layer in floors["layers"]]
    for module in ours(graph) - {m for m in ours(graph) if m.startswith("kernel_factory.kernels.")}:
        homes = [i for i, layer in enumerate(layers)
                 if any(module == name or module.startswith(name + ".") for name in layer)]
        assert len(homes) == 1, f"{module} is in layers {homes} of the floors contract; list it in exactly one"
    (apart,) = [c for c in LINTER["contracts"] if c.get("id") == "exported-op"]
    assert apart["source_modules"] == ["kernel_factory.kernels.**"]
