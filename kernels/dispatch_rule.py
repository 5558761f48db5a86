"""A learned dispatch rule as the op evaluates it: a small decision tree over a call's shape features whose leaves
name genomes, or a nearest-shapes node: the training shapes nearest the call (in log2 M, log2 N, with rows that do
not split into whole vectors kept apart) vote with each genome's measured slowdown there, and the genome with the
least total wins. The factory learns either from its measurements (evo/tools/learn.py) and the op evaluates it once
per new (dtype, M, N). Features are what changes the best kernel of a row-wise op: rows per SM, row bytes, row width
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
    while "leaf" not in node and "near" not in node:
        node = node["then"] if feats[node["feature"]] <= node["le"] else node["else"]
    if "near" in node:
        return nearest(node["near"], feats), int(node.get("id", 0))
    return node["leaf"], int(node.get("id", 0))


def check(node: Any, where: str, depth: int = 0) -> list[str]:
    """Problems with a tree's structure (unknown feature, missing branch), as messages naming the node; [] when the
    tree is well formed. The genomes its leaves name are checked by the table."""
    if not isinstance(node, Mapping):
        return [f"{where}: a node must be a mapping"]
    if "leaf" in node:
        return [] if isinstance(node["leaf"], str) else [f"{where}: leaf must name a genome id"]
    if "near" in node:
        return check_near(node["near"], f"{where}.near")
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


def check_near(near: Any, where: str) -> list[str]:
    if not isinstance(near, Mapping):
        return [f"{where}: must be a mapping"]
    problems = []
    if not isinstance(near.get("k"), int) or near["k"] < 1:
        problems.append(f"{where}: 'k' must be a whole number >= 1")
    genomes, points = near.get("genomes"), near.get("points")
    if not isinstance(genomes, list) or not genomes or not all(isinstance(g, str) for g in genomes):
        problems.append(f"{where}: 'genomes' must list genome ids")
    if not isinstance(points, list) or not points:
        return problems + [f"{where}: 'points' must list the training shapes"]
    for i, pt in enumerate(points):
        at, cost = (pt.get("at"), pt.get("cost")) if isinstance(pt, Mapping) else (None, None)
        if not (isinstance(at, list) and len(at) == 3 and all(isinstance(v, (int, float)) for v in at)):
            problems.append(f"{where}.points[{i}]: 'at' must be [log2 M, log2 N, whole vectors 0 or 1]")
        if not (isinstance(cost, Mapping) and all(isinstance(v, (int, float)) for v in cost.values())):
            problems.append(f"{where}.points[{i}]: 'cost' must map genome ids to log slowdowns")
    return problems


def nearest(near: Mapping[str, Any], feats: Mapping[str, float]) -> str:
    """The genome with the least total log slowdown over the k training shapes nearest these features (a genome
    not measured at a shape counts `missing` there; ties go to the first in `genomes`)."""
    here = (feats["log2_m"], feats["log2_n"])
    apart = float(near.get("vec_weight", 4.0))
    points = sorted(near["points"], key=lambda p: math.dist(here, p["at"][:2]) + apart * abs(feats["vec_ok"] - p["at"][2]))
    votes = points[:near["k"]]
    missing = float(near.get("missing", math.log(2.0)))
    return min(near["genomes"], key=lambda g: sum(p["cost"].get(g, missing) for p in votes))


def leaves(node: Mapping[str, Any]) -> list[str]:
    """Every genome id the tree can choose, in leaf order."""
    if "leaf" in node:
        return [node["leaf"]]
    if "near" in node:
        return list(node["near"]["genomes"])
    return leaves(node["then"]) + leaves(node["else"])
