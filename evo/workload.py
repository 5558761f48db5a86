"""The distribution of shapes a problem serves, and what the factory draws from it: a training set the search sees,
a disjoint held-out set it never sees, and the buckets that split the workload where the best kernel changes.

A problem plugin declares its `workload` (dtypes, a law for M and one for N, the memory limit); a run config may
narrow it. Draws are seeded, so a campaign's sets can be re-drawn from its config alone, and are recorded with it.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from ..kernels import dispatch_rule
from .types import Case

ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Hidden sizes of published models (and their MLP widths): the widths users bring first.
MODEL_WIDTHS = (512, 768, 1024, 1280, 1536, 2048, 2304, 2560, 2880, 3072, 3584, 4096, 5120, 5376, 6144, 7168, 8192,
                11008, 12288, 13824, 14336, 16384, 18432, 20480, 28672, 53248)
N_LAWS = ("model", "pow2", "uniform", "odd")


@dataclass(frozen=True)
class Workload:
    """What a problem serves: shapes (M, N) per dtype. M is log-uniform over `m`, with `small_m_share` of the draws
    below the SM count (M = 1 included); N follows a mixture of laws over `n`: model widths, powers of two,
    log-uniform widths, and odd widths (not a multiple of 8). Draws whose largest tensor would exceed `max_bytes`
    are drawn again."""

    dtypes: tuple[str, ...]
    m: tuple[int, int] = (1, 65536)
    n: tuple[int, int] = (64, 262144)
    small_m_share: float = 0.25
    laws: Mapping[str, float] = field(default_factory=lambda: {"model": 0.3, "pow2": 0.15, "uniform": 0.25,
                                                               "odd": 0.3})
    model_widths: tuple[int, ...] = MODEL_WIDTHS
    max_bytes: int = 2 * 2**30
    sms: int = dispatch_rule.SMS

    def problems(self) -> list[str]:
        """What is wrong with this workload (empty when usable), each naming the field."""
        out = []
        if not self.dtypes:
            out.append("dtypes: at least one")
        for name, (lo, hi) in (("m", self.m), ("n", self.n)):
            if not 1 <= lo <= hi:
                out.append(f"{name}: [{lo}, {hi}] must satisfy 1 <= low <= high")
        if not 0.0 <= self.small_m_share <= 1.0:
            out.append(f"small_m_share: {self.small_m_share} must be in [0, 1]")
        unknown = sorted(set(self.laws) - set(N_LAWS))
        if unknown or not self.laws or min(self.laws.values()) < 0 or sum(self.laws.values()) <= 0:
            out.append(f"laws: weights >= 0 (not all 0) for {', '.join(N_LAWS)}; got {dict(self.laws)}")
        if self.max_bytes < 1024:
            out.append(f"max_bytes: {self.max_bytes} is too small to hold a row")
        return out


@runtime_checkable
class ServesWorkload(Protocol):
    """A problem that declares the distribution of shapes it serves (optional; workload campaigns need it)."""

    workload: Workload


@dataclass(frozen=True)
class Split:
    """A workload's seeded draws: the training cases a search may see and the disjoint held-out cases."""

    train: tuple[Case, ...]
    heldout: tuple[Case, ...]

    def to_json(self) -> dict[str, Any]:
        return {"train": [c.key for c in self.train], "heldout": [c.key for c in self.heldout]}


def narrow(workload: Workload, **changes: Any) -> Workload:
    """The workload with a config's narrower settings; a setting that widens it raises ValueError naming it."""
    out = replace(workload, **{k: (tuple(v) if isinstance(v, list) else v) for k, v in changes.items()
                               if v is not None})
    wider = [d for d in out.dtypes if d not in workload.dtypes]
    if wider:
        raise ValueError(f"dtypes: {wider[0]!r} is not served by the problem (it serves {', '.join(workload.dtypes)})")
    for name in ("m", "n"):
        (lo, hi), (wlo, whi) = getattr(out, name), getattr(workload, name)
        if lo < wlo or hi > whi:
            raise ValueError(f"{name}: [{lo}, {hi}] is wider than the problem's [{wlo}, {whi}]")
    problems = out.problems()
    if problems:
        raise ValueError(problems[0])
    return out


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi] whose logarithm is uniform (floor of a log-uniform real in [lo, hi + 1))."""
    return min(hi, max(lo, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _draw_m(w: Workload, rng: random.Random) -> int:
    lo, hi = w.m
    if lo < w.sms and rng.random() < w.small_m_share:
        return _log_uniform(rng, lo, min(hi, w.sms - 1))
    return _log_uniform(rng, max(lo, min(hi, w.sms)), hi)


def _draw_n(w: Workload, rng: random.Random, law: str) -> int | None:
    lo, hi = w.n
    if law == "model":
        inside = [n for n in w.model_widths if lo <= n <= hi]
        return rng.choice(inside) if inside else None
    if law == "pow2":
        inside = [1 << k for k in range(0, 31) if lo <= 1 << k <= hi]
        return rng.choice(inside) if inside else None
    n = _log_uniform(rng, lo, hi)
    if law == "odd" and n % 8 == 0:
        n += rng.choice((-1, 1)) * rng.randint(1, 7)
        n = n if lo <= n <= hi else None
    return n


def draw(w: Workload, dtype: str, count: int, rng: random.Random, exclude: set[Case] = frozenset()) -> list[Case]:
    """`count` distinct cases of one dtype, none in `exclude`, each within the memory limit."""
    laws = [law for law in N_LAWS if w.laws.get(law, 0) > 0]
    weights = [w.laws[law] for law in laws]
    out: list[Case] = []
    seen = set(exclude)
    for _ in range(count * 200):
        if len(out) == count:
            return out
        n = _draw_n(w, rng, rng.choices(laws, weights)[0])
        if n is None:
            continue
        m = _draw_m(w, rng)
        while m > 1 and m * n * ELEM_BYTES[dtype] > w.max_bytes:
            m //= 2
        case = Case((m, n), dtype)
        if case not in seen and m * n * ELEM_BYTES[dtype] <= w.max_bytes:
            seen.add(case)
            out.append(case)
    raise ValueError(f"the workload holds fewer than {count} distinct {dtype} shapes within its limits")


def split(w: Workload, seed: int, train: int, heldout: int) -> Split:
    """Per dtype, `train` training cases and `heldout` held-out cases, disjoint, from independent seeded streams
    (the held-out stream never depends on how many training cases were drawn)."""
    tr: list[Case] = []
    ho: list[Case] = []
    for dtype in w.dtypes:
        held = draw(w, dtype, heldout, random.Random(f"{seed}:heldout:{dtype}"))
        ho += held
        tr += draw(w, dtype, train, random.Random(f"{seed}:train:{dtype}"), exclude=set(held))
    return Split(tuple(tr), tuple(ho))


# ---- buckets --------------------------------------------------------------------------------------------------------
# Where the best kernel changes: fewer rows than SMs (a row must be split to use the GPU), a few waves, many waves;
# rows that fit a warp's registers, a CTA's registers, a CTA's shared memory, or only a cluster; rows of whole
# 16-byte vectors or with a tail.
M_CLASSES = ((1, "m<sms"), (dispatch_rule.SMS, "m<16w"), (16 * dispatch_rule.SMS, "m-large"))
ROW_CLASSES = ((0, "row<=2K"), (2 * 1024 + 1, "row<=32K"), (32 * 1024 + 1, "row<=192K"), (192 * 1024 + 1, "row>192K"))


def _classify(value: int, classes: Sequence[tuple[int, str]]) -> tuple[int, str]:
    index = max(i for i, (lo, _) in enumerate(classes) if value >= lo)
    return index, classes[index][1]


def bucket(case: Case, by_dtype: bool = True) -> str:
    """The bucket of a case: dtype (or `any`) / M class / row-bytes class / vec or tail."""
    m, n = case.shape[0], case.shape[-1]
    row = n * ELEM_BYTES[case.dtype]
    vec = "vec" if row % dispatch_rule.VEC_BYTES == 0 else "tail"
    return f"{case.dtype if by_dtype else 'any'}/{_classify(m, M_CLASSES)[1]}/{_classify(row, ROW_CLASSES)[1]}/{vec}"


def _coordinates(name: str) -> tuple[str, int, int, int]:
    dtype, m, row, vec = name.split("/")
    return (dtype, [c for _, c in M_CLASSES].index(m), [c for _, c in ROW_CLASSES].index(row),
            0 if vec == "vec" else 1)


def distance(a: str, b: str) -> float:
    """How far apart two buckets are (the same dtype first; then M class, row class and tail steps): warm starts
    and crossover draw from the nearest buckets searched before."""
    (da, ma, ra, va), (db, mb, rb, vb) = _coordinates(a), _coordinates(b)
    return (0 if da == db else 10) + abs(ma - mb) + abs(ra - rb) + 0.5 * abs(va - vb)


def by_bucket(cases: Sequence[Case], by_dtype: bool = True) -> dict[str, list[Case]]:
    """Cases grouped by bucket, buckets in a stable order (dtype, M class, row class, vec before tail)."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(bucket(case, by_dtype), []).append(case)
    return {k: sorted(groups[k], key=lambda c: (c.dtype, c.shape)) for k in sorted(groups, key=_coordinates)}
