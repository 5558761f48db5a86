"""A learned dispatch rule as the op evaluates it: a small decision tree over a call's shape features whose leaves
name genomes. The factory learns the tree from its measurements (evo/tools/learn.py) and the op walks it once per
new (dtype, M, N). Features are what changes the best kernel of a row-wise op: rows per SM, row bytes, row width
and whether rows split into whole 16-byte vectors. Needs only the standard library.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

SMS = 132            # the H200's SM count: rows per SM is M / SMS
VEC_BYTES = 16       # the widest vector access; a row of another length needs a tail
FEATURES = ("log2_m", "log2_n", "log2_row_bytes", "log2_rows_per_sm", "vec_ok")


def features(m: int, n: int, elem_bytes: int) -> dict[str, float]:
    """The shape features a rule may split on, for M rows of N elements of elem_bytes each."""
    return {"log2_m": math.log2(max(m, 1)), "log2_n": math.log2(max(n, 1)),
            "log2_row_bytes": math.log2(max(n * elem_bytes, 1)),
            "log2_rows_per_sm": math.log2(max(m, 1) / SMS),
            "vec_ok": 1.0 if (n * elem_bytes) % VEC_BYTES == 0 else 0.0}


def choose(node: Mapping[str, Any], feats: Mapping[str, float]) -> tuple[str, int]:
    """(genome id, leaf number) the tree picks for these features."""
    while "leaf" not in node:
        node = node["then"] if feats[node["feature"]] <= node["le"] else node["else"]
    return node["leaf"], int(node.get("id", 0))


def check(node: Any, where: str, depth: int = 0) -> list[str]:
    """Problems with a tree's structure (unknown feature, missing branch), as messages naming the node; [] when the
    tree is well formed. The genomes its leaves name are checked by the table."""
    if not isinstance(node, Mapping):
        return [f"{where}: a node must be a mapping"]
    if "leaf" in node:
        return [] if isinstance(node["leaf"], str) else [f"{where}: leaf must name a genome id"]
    if depth > 32:
        return [f"{where}: deeper than 32 levels"]
    problems = []
    if node.get("feature") not in FEATURES:
        problems.append(f"{where}: feature {node.get('feature')!r} is not one of {', '.join(FEATURES)}")
    if not isinstance(node.get("le"), (int, float)):
        problems.append(f"{where}: 'le' must be a number")
    for branch in ("then", "else"):
        problems += check(node.get(branch), f"{where}.{branch}", depth + 1) if branch in node else [
            f"{where}: missing '{branch}'"]
    return problems


def leaves(node: Mapping[str, Any]) -> list[str]:
    """Every genome id the tree can choose, in leaf order."""
    if "leaf" in node:
        return [node["leaf"]]
    return leaves(node["then"]) + leaves(node["else"])
