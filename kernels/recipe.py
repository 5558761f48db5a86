"""Launch recipes: how to launch a compiled kernel on any (M, N), written as data.

A recipe is what `kernel-factory export` writes beside each cubin, so that the library op can launch it without the
problem plugin that made it, and what the problem plugins themselves launch from, so that the factory and the op
run the same plan. It is plain JSON:

    {"let":     [["name", EXPR], ...],                 evaluated in order; later ones may use earlier names
     "buffers": {"name": {"dtype": "float32", "shape": [EXPR, ...]}},   scratch the op allocates (uninitialised)
     "steps":   [{"kernel": "entry", "grid": EXPR, "block": EXPR, "cluster": EXPR, "smem": EXPR,
                  "args": [["ptr", "x"], ["i32", EXPR], ["f32", EXPR], ...], "when": EXPR}, ...]}

An EXPR is a number, a name (M, N, eps, a `let` name) or a list [OP, EXPR, ...] with OP one of OPS. ["align", "x"]
is the largest power of two (at most 16) that divides tensor x's address. `grid` counts CTAs along x (a multiple of
`cluster`); block and cluster are along x too. A step runs only where its optional `when` holds (a plan may take
another path at small M), and a buffer is allocated only where a step that runs names it. Needs only the standard
library.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

FORMAT = "kernel-factory-recipe/1"


class RecipeError(ValueError):
    """A recipe that cannot be evaluated: an unknown operation or name; the message says which."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pick(cond: Any, yes: Any, no: Any) -> Any:
    return yes if cond else no


OPS: dict[str, Callable[..., Any]] = {
    "add": lambda *a: sum(a), "sub": operator.sub, "mul": lambda *a: math.prod(a), "div": operator.floordiv, "cdiv": _cdiv,
    "mod": operator.mod, "min": min, "max": max, "if": _pick, "lt": operator.lt, "le": operator.le,
    "eq": operator.eq, "ne": operator.ne, "and": lambda *a: all(a), "or": lambda *a: any(a),
    "not": operator.not_,
}


def value(expr: Any, env: Mapping[str, Any]) -> Any:
    """An expression's value in env (names -> numbers; 'align:<tensor>' -> that tensor's address alignment)."""
    if isinstance(expr, (bool, int, float)):
        return expr
    if isinstance(expr, str):
        if expr not in env:
            raise RecipeError(f"recipe names {expr!r}, which is not defined; defined: {', '.join(sorted(env))}")
        return env[expr]
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str):
        raise RecipeError(f"not a recipe expression: {expr!r}")
    op, *args = expr
    if op == "align":
        return value(f"align:{args[0]}", env)
    if op == "if":   # only the branch taken is evaluated
        return value(args[1] if value(args[0], env) else args[2], env)
    if op not in OPS:
        raise RecipeError(f"unknown recipe operation {op!r}; known: align, {', '.join(sorted(OPS))}")
    return OPS[op](*(value(a, env) for a in args))


def alignment(address: int) -> int:
    """The largest power of two, at most 16, that divides address."""
    return min(16, address & -address) if address else 16


@dataclass(frozen=True)
class Step:
    """One kernel launch of an evaluated recipe: args are ("ptr", tensor name) or ("i32"/"f32", number)."""

    kernel: str
    grid: int
    block: int
    cluster: int
    smem: int
    args: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    buffers: Mapping[str, tuple[str, tuple[int, ...]]]   # name -> (dtype, shape)


def names(recipe: Mapping[str, Any], m: int, n: int, eps: float = 0.0,
          addresses: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Every name a recipe defines, evaluated for rows (m, n), eps and the tensors' addresses."""
    env: dict[str, Any] = {"M": m, "N": n, "eps": eps}
    env.update({f"align:{k}": alignment(a) for k, a in (addresses or {}).items()})
    for name, expr in recipe.get("let", ()):
        env[name] = value(expr, env)
    return env


def evaluate(recipe: Mapping[str, Any], m: int, n: int, eps: float = 0.0,
             addresses: Mapping[str, int] | None = None) -> Plan:
    """The launch plan of a recipe for rows (m, n), eps, and the tensors' addresses (only their alignment counts)."""
    env = names(recipe, m, n, eps, addresses)
    run = [s for s in recipe["steps"] if value(s.get("when", True), env)]
    used = {a for s in run for kind, a in s["args"] if kind == "ptr"}
    buffers = {name: (spec["dtype"], tuple(int(value(d, env)) for d in spec["shape"]))
               for name, spec in recipe.get("buffers", {}).items() if name in used}
    steps = []
    for s in run:
        args = tuple((kind, a if kind == "ptr" else value(a, env)) for kind, a in s["args"])
        steps.append(Step(s.get("kernel", ""), int(value(s["grid"], env)), int(value(s["block"], env)),
                          int(value(s.get("cluster", 1), env)), int(value(s.get("smem", 0), env)), args))
    return Plan(tuple(steps), buffers)


def aligned_names(recipe: Mapping[str, Any]) -> list[str]:
    """The tensors whose alignment the recipe reads (the op keys its cached plans on those alone)."""
    found: set[str] = set()

    def walk(expr: Any) -> None:
        if isinstance(expr, list) and expr:
            if expr[0] == "align":
                found.add(expr[1])
            for a in expr[1:]:
                walk(a)
    for _, expr in recipe.get("let", ()):
        walk(expr)
    for s in recipe["steps"]:
        for key in ("grid", "block", "cluster", "smem", "when"):
            walk(s.get(key))
        for kind, arg in s["args"]:
            if kind != "ptr":
                walk(arg)
    return sorted(found)
