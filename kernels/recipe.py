"""Launch recipes: how to launch a compiled kernel on any shape, written as data.

A recipe is what `kernel-factory export` writes beside each cubin, so that a library op can launch it without the
problem plugin that made it, and what problem plugins themselves launch from, so that the factory and the op run the
same plan. It is plain JSON (docs/adding-a-problem.md, "The launch recipe", has worked examples):

    {"let":     [["name", EXPR], ...],                 evaluated in order; later ones may use earlier names
     "buffers": {"name": {"dtype": "float32", "shape": [EXPR, ...]}},   scratch the op allocates (uninitialised)
     "steps":   [{"kernel": "entry", "grid": DIM, "block": DIM, "cluster": DIM, "smem": EXPR,
                  "args": [[KIND, "x" or EXPR], ...], "when": EXPR}, ...],
     "op":      {"inputs": ["x", ...], "outputs": {"y": {"like": "x"} or {"dtype": D, "shape": [EXPR, ...]}},
                 "returns": ["y", ...],             the outputs' order (needed for two or more)
                 "scalars": {"eps": 1e-6}}}         optional: what a generic library op needs (kernels/op.py)

An EXPR is a number, a name or a list [OP, EXPR, ...] with OP one of OPS or a tensor query. Names: M and N (N is the
last dimension of the case's shape, M the product of the others), eps, the op's scalars, and the `let` names.
Tensor queries, for any tensor the plan launches on: ["align", "x"] (the largest power of two, at most 16, that
divides x's address), ["size", "x", d] and ["stride", "x", d] (elements; d may be negative) and ["numel", "x"].
Values are Python ints, so sizes and strides past 2^31 are exact; pass them as "i64" (an "i32" argument that does not
fit is an error, never a silent wrap).

A DIM is an EXPR (along x) or {"x": EXPR, "y": EXPR, "z": EXPR} (a missing one is 1): `grid` counts CTAs in each
dimension (a multiple of `cluster` there), `block` threads. KIND is "ptr" (a tensor by name: its address) or a
scalar type: i32, u32, i64, u64, f32, f64. A step runs only where its optional `when` holds (a plan may take another
path at small M), and a buffer is allocated only where a step that runs names it. Needs only the standard library.
"""
from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping

FORMAT = "kernel-factory-recipe/1"
SCALAR_KINDS = {"i32": (-2**31, 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-2**63, 2**63 - 1), "u64": (0, 2**64 - 1),
                "f32": None, "f64": None}
ARG_KINDS = ("ptr", *SCALAR_KINDS)
TENSOR_QUERIES = ("align", "size", "stride", "numel")
DIMENSIONS = ("x", "y", "z")
STEP_KEYS = ("kernel", "grid", "block", "cluster", "smem", "args", "when")


class RecipeError(ValueError):
    """A recipe that cannot be evaluated: an unknown operation or name; the message says which."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pick(cond: Any, yes: Any, no: Any) -> Any:
    return yes if cond else no


OPS: dict[str, Callable[..., Any]] = {
    "add": lambda *a: sum(a), "sub": operator.sub, "mul": lambda *a: math.prod(a), "div": operator.floordiv,
    "cdiv": _cdiv, "mod": operator.mod, "min": min, "max": max, "if": _pick, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne, "and": lambda *a: all(a),
    "or": lambda *a: any(a), "not": operator.not_,
}


def _query(op: str, args: list, env: Mapping[str, Any]) -> Any:
    """A tensor query's value: alignment, size, stride or element count of a tensor the plan launches on."""
    if not args or not isinstance(args[0], str):
        raise RecipeError(f"[{op!r}, ...] needs a tensor name first, got {args!r}")
    if op == "align":
        return value(f"align:{args[0]}", env)
    shape = env.get(f"shape:{args[0]}")
    if shape is None:
        raise RecipeError(f"recipe asks the {op} of tensor {args[0]!r}, which it is not given; given: "
                          f"{', '.join(sorted(k[6:] for k in env if k.startswith('shape:'))) or 'none'}")
    if op == "numel":
        return math.prod(shape)
    dim = value(args[1], env) if len(args) > 1 else None
    if not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise RecipeError(f"[{op!r}, {args[0]!r}, {dim!r}]: tensor {args[0]!r} has {len(shape)} dimensions")
    return shape[dim] if op == "size" else env[f"stride:{args[0]}"][dim]


def value(expr: Any, env: Mapping[str, Any]) -> Any:
    """An expression's value in env (names -> numbers; 'align:<t>', 'shape:<t>', 'stride:<t>' describe tensor t)."""
    if isinstance(expr, (bool, int, float)):
        return expr
    if isinstance(expr, str):
        if expr not in env:
            raise RecipeError(f"recipe names {expr!r}, which is not defined; defined: "
                              f"{', '.join(sorted(k for k in env if ':' not in k))}")
        return env[expr]
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str):
        raise RecipeError(f"not a recipe expression: {expr!r}")
    op, *args = expr
    if op in TENSOR_QUERIES:
        return _query(op, args, env)
    if op == "if":   # only the branch taken is evaluated
        return value(args[1] if value(args[0], env) else args[2], env)
    if op not in OPS:
        raise RecipeError(f"unknown recipe operation {op!r}; known: {', '.join(TENSOR_QUERIES)}, "
                          f"{', '.join(sorted(OPS))}")
    return OPS[op](*(value(a, env) for a in args))


def alignment(address: int) -> int:
    """The largest power of two, at most 16, that divides address."""
    return min(16, address & -address) if address else 16


@dataclass(frozen=True)
class Step:
    """One kernel launch of an evaluated recipe: args are ("ptr", tensor name) or (scalar kind, number). grid, block
    and cluster are along x; the *_yz pairs hold the other two dimensions (1 unless the recipe gives a DIM mapping)."""

    kernel: str
    grid: int
    block: int
    cluster: int
    smem: int
    args: tuple[tuple[str, Any], ...]
    grid_yz: tuple[int, int] = (1, 1)
    block_yz: tuple[int, int] = (1, 1)
    cluster_yz: tuple[int, int] = (1, 1)

    @property
    def grid3(self) -> tuple[int, int, int]:
        return (self.grid, *self.grid_yz)

    @property
    def block3(self) -> tuple[int, int, int]:
        return (self.block, *self.block_yz)

    @property
    def cluster3(self) -> tuple[int, int, int]:
        return (self.cluster, *self.cluster_yz)


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    buffers: Mapping[str, tuple[str, tuple[int, ...]]]   # name -> (dtype, shape)


def names(recipe: Mapping[str, Any], m: int, n: int, eps: float | None = None,
          addresses: Mapping[str, int] | None = None,
          layouts: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
          scalars: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Every name a recipe defines, evaluated for rows (m, n), eps, the tensors' addresses and (shape, strides), and
    the op's scalars (given ones, else the recipe's defaults; eps is 0 unless given or defaulted)."""
    defaults = recipe.get("op", {}).get("scalars", {})
    env: dict[str, Any] = {"M": m, "N": n, "eps": defaults.get("eps", 0.0) if eps is None else eps,
                           **{k: v for k, v in defaults.items() if k != "eps"}, **(scalars or {})}
    env.update({f"align:{k}": alignment(a) for k, a in (addresses or {}).items()})
    for name, (shape, strides) in (layouts or {}).items():
        env[f"shape:{name}"], env[f"stride:{name}"] = tuple(shape), tuple(strides)
    for name, expr in recipe.get("let", ()):
        env[name] = value(expr, env)
    return env


def _dim3(spec: Any, env: Mapping[str, Any], default: int = 1) -> tuple[int, int, int]:
    if isinstance(spec, dict):
        return tuple(int(value(spec.get(d, 1), env)) for d in DIMENSIONS)   # type: ignore[return-value]
    return int(value(default if spec is None else spec, env)), 1, 1


def _scalar(kind: str, v: Any, where: str) -> Any:
    limits = SCALAR_KINDS[kind]
    if limits is None:
        return float(v)
    if int(v) != v or not limits[0] <= int(v) <= limits[1]:
        raise RecipeError(f"{where}: {v!r} does not fit an {kind} argument (pass sizes past 2^31 as i64)")
    return int(v)


def evaluate(recipe: Mapping[str, Any], m: int, n: int, eps: float | None = None,
             addresses: Mapping[str, int] | None = None,
             layouts: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
             scalars: Mapping[str, float] | None = None) -> Plan:
    """The launch plan of a recipe for rows (m, n), eps, and the tensors' addresses (only their alignment counts),
    shapes and strides."""
    env = names(recipe, m, n, eps, addresses, layouts, scalars)
    run = [s for s in recipe["steps"] if value(s.get("when", True), env)]
    used = {a for s in run for kind, a in s["args"] if kind == "ptr"}
    buffers = {name: (spec["dtype"], tuple(int(value(d, env)) for d in spec["shape"]))
               for name, spec in recipe.get("buffers", {}).items() if name in used}
    steps = []
    for i, s in enumerate(run):
        args = tuple((kind, a if kind == "ptr" else _scalar(kind, value(a, env), f"step {i} argument {j}"))
                     for j, (kind, a) in enumerate(s["args"]))
        grid, block, cluster = _dim3(s["grid"], env), _dim3(s["block"], env), _dim3(s.get("cluster"), env)
        steps.append(Step(s.get("kernel", ""), grid[0], block[0], cluster[0], int(value(s.get("smem", 0), env)),
                          args, grid[1:], block[1:], cluster[1:]))
    return Plan(tuple(steps), buffers)


def _walk(expr: Any, found: dict[str, set[str]]) -> None:
    if isinstance(expr, dict):
        for v in expr.values():
            _walk(v, found)
    elif isinstance(expr, list) and expr:
        if expr[0] in TENSOR_QUERIES and len(expr) > 1 and isinstance(expr[1], str):
            found["align" if expr[0] == "align" else "layout"].add(expr[1])
        for a in expr[1:]:
            _walk(a, found)


def queried(recipe: Mapping[str, Any]) -> dict[str, set[str]]:
    """The tensors whose alignment ("align") or shape and strides ("layout") the recipe reads."""
    found: dict[str, set[str]] = {"align": set(), "layout": set()}
    for _, expr in recipe.get("let", ()):
        _walk(expr, found)
    for spec in recipe.get("buffers", {}).values():
        _walk(spec.get("shape", []), found)
    for spec in recipe.get("op", {}).get("outputs", {}).values():
        _walk(spec.get("shape", []), found)
    for s in recipe["steps"]:
        for key in ("grid", "block", "cluster", "smem", "when"):
            _walk(s.get(key), found)
        for kind, arg in s["args"]:
            if kind != "ptr":
                _walk(arg, found)
    return found


def aligned_names(recipe: Mapping[str, Any]) -> list[str]:
    """The tensors whose alignment the recipe reads (the op keys its cached plans on those alone)."""
    return sorted(queried(recipe)["align"])


def pack(kind: str, v: Any) -> int:
    """A scalar argument's bits in a 64-bit parameter slot (little-endian: the low bytes are the value)."""
    if kind == "f32":
        return struct.unpack("<I", struct.pack("<f", float(v)))[0]
    if kind == "f64":
        return struct.unpack("<Q", struct.pack("<d", float(v)))[0]
    return int(v) & (0xFFFFFFFF if kind in ("i32", "u32") else 0xFFFFFFFFFFFFFFFF)


def _expr_problems(expr: Any, where: str) -> list[str]:
    if isinstance(expr, (bool, int, float, str)):
        return []
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str):
        return [f"{where}: not a recipe expression: {expr!r}"]
    if expr[0] not in OPS and expr[0] not in TENSOR_QUERIES:
        return [f"{where}: unknown recipe operation {expr[0]!r}"]
    if expr[0] in TENSOR_QUERIES:
        return [] if len(expr) > 1 and isinstance(expr[1], str) else [f"{where}: {expr!r} needs a tensor name"]
    return [p for a in expr[1:] for p in _expr_problems(a, where)]


def _dim_problems(spec: Any, where: str) -> list[str]:
    if isinstance(spec, dict):
        stray = sorted(set(spec) - set(DIMENSIONS))
        return ([f"{where}: unknown dimension {stray[0]!r} (x, y, z)"] if stray else
                [p for d, v in spec.items() for p in _expr_problems(v, f"{where}.{d}")])
    return _expr_problems(spec, where)


def check(recipe: Any) -> list[str]:
    """What is wrong with a recipe's form (unknown keys, operations, argument kinds; tensors no one provides), one
    line each; empty when it is well formed. Says nothing about its values: evaluate() does."""
    if not isinstance(recipe, Mapping) or not isinstance(recipe.get("steps"), list) or not recipe["steps"]:
        return ["a recipe is a mapping with a non-empty list of steps"]
    problems = [f"unknown recipe key {k!r}" for k in recipe if k not in ("let", "buffers", "steps", "op")]
    for i, (name, expr) in enumerate(recipe.get("let", ())):
        problems += _expr_problems(expr, f"let {name!r}")
    for i, step in enumerate(recipe["steps"]):
        where = f"step {i}"
        problems += [f"{where}: unknown key {k!r} ({', '.join(STEP_KEYS)})" for k in step if k not in STEP_KEYS]
        if "grid" not in step or "block" not in step:
            problems.append(f"{where}: needs a grid and a block")
        for key in ("grid", "block", "cluster"):
            problems += _dim_problems(step.get(key, 1), f"{where} {key}")
        for key in ("smem", "when"):
            problems += _expr_problems(step.get(key, 0), f"{where} {key}")
        for j, arg in enumerate(step.get("args", ())):
            if not isinstance(arg, list) or len(arg) != 2 or arg[0] not in ARG_KINDS:
                problems.append(f"{where} argument {j}: {arg!r} is not [KIND, value] with KIND one of "
                                f"{', '.join(ARG_KINDS)}")
            elif arg[0] != "ptr":
                problems += _expr_problems(arg[1], f"{where} argument {j}")
    return problems + op_problems(recipe)


def op_problems(recipe: Mapping[str, Any]) -> list[str]:
    """What keeps a generic library op (kernels/op.py) from running this recipe, one line each; the recipe needs an
    `op` section whose inputs and outputs name every tensor a step takes that is not a scratch buffer."""
    op = recipe.get("op")
    if op is None:
        return []
    if not isinstance(op, Mapping) or not isinstance(op.get("inputs"), list) or not op["inputs"] \
            or not isinstance(op.get("outputs"), Mapping) or not op["outputs"]:
        return ["op: needs a non-empty list of inputs and a non-empty mapping of outputs"]
    problems = [f"op: unknown key {k!r} (inputs, outputs, returns, scalars)" for k in op if k not in
                ("inputs", "outputs", "returns", "scalars")]
    if len(op["outputs"]) > 1 and sorted(op.get("returns", ())) != sorted(op["outputs"]):
        problems.append(f"op: outputs {', '.join(op['outputs'])} need 'returns', the order the op gives them in, "
                        f"each once (a JSON mapping's order does not survive export)")
    known = set(op["inputs"]) | set(op["outputs"]) | set(recipe.get("buffers", {}))
    for name, spec in op["outputs"].items():
        if "like" in spec:
            if spec["like"] not in op["inputs"]:
                problems.append(f"op: output {name!r} is like {spec['like']!r}, which is not an input")
        elif not isinstance(spec.get("dtype"), str) or not isinstance(spec.get("shape"), list):
            problems.append(f"op: output {name!r} needs {{'like': INPUT}} or a dtype and a shape")
        else:
            problems += [p for d in spec["shape"] for p in _expr_problems(d, f"op output {name!r} shape")]
    for i, step in enumerate(recipe["steps"]):
        for kind, arg in step.get("args", ()):
            if kind == "ptr" and arg not in known:
                problems.append(f"step {i}: tensor {arg!r} is neither an op input, an op output nor a buffer")
    for name, v in op.get("scalars", {}).items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            problems.append(f"op: scalar {name!r} needs a number as its default, got {v!r}")
    return problems
