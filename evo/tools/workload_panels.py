"""A workload campaign's plan (what it works on) and its panels (evo/tools/workload.py, step 3): which genomes each
dtype's panel times (its buckets' winners, the genomes of a table and an earlier campaign's panel winners,
shape-dependent twins), and panels read back, from a campaign folder or packed in its panels.tar.xz."""
from __future__ import annotations

import dataclasses
import json
import sys
import tarfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import build, registry
from ..evaluate import render
from ..config import ConfigError, RunConfig
from ..run import table_seeds
from ..types import Case, GeneSpace, GeneValue, Genome
from ..workload import Split, Workload
from . import learn

PLAN = "workload.json"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a campaign works on, before anything is measured."""

    workload: Workload
    split: Split
    buckets: dict[str, list[Case]]
    more: tuple[Case, ...] = ()     # workload.train_more: training shapes for the panels and the rule alone

    def to_json(self) -> dict[str, Any]:
        return {"workload": {**dataclasses.asdict(self.workload), "laws": dict(self.workload.laws)},
                **self.split.to_json(), "buckets": {b: [c.key for c in cs] for b, cs in self.buckets.items()},
                **({"train_more": [c.key for c in self.more]} if self.more else {})}


def earlier_panels(cfg: RunConfig, folder: Path, p: Plan) -> dict[str, Path]:
    """Steps 2-3 of an earlier campaign: its panels (panel-<dtype>.jsonl, or packed in panels.tar.xz as committed),
    copied into this campaign's folder. It must have drawn this plan's held-out shapes, so that none was timed."""
    key = "config key 'workload.panels_from'"
    if cfg.workload.searched_from:
        raise ConfigError(f"{key} and 'workload.searched_from' exclude each other: panels_from learns from panels "
                          f"already timed, searched_from times its winners again")
    out = {}
    for dtype, text in panel_texts(cfg.workload.panels_from, p, key).items():
        out[dtype] = folder / f"panel-{dtype}.jsonl"
        out[dtype].write_bytes(text)
    print(f"workload: panels of {', '.join(out)} from {cfg.workload.panels_from} (no search, nothing timed)",
          file=sys.stderr)
    return out


def panel_texts(folder: str, p: Plan, key: str) -> dict[str, bytes]:
    """An earlier campaign folder's panel files by dtype (panel-<dtype>.jsonl, or packed in its panels.tar.xz);
    the campaign must have drawn this plan's held-out shapes (`key` names the config key in errors)."""
    src = Path(folder)
    try:
        earlier = json.loads((src / PLAN).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}: {str(src)!r} is not a campaign folder ({exc})") from None
    if sorted(earlier.get("heldout", [])) != sorted(c.key for c in p.split.heldout):
        raise ConfigError(f"{key}: {str(src)!r} drew other held-out shapes than this workload; use the same "
                          f"workload keys as that campaign")
    packed = tarfile.open(src / "panels.tar.xz") if (src / "panels.tar.xz").is_file() else None
    out = {}
    try:
        for dtype in p.workload.dtypes:
            name = f"panel-{dtype}.jsonl"
            if (src / name).is_file():
                out[dtype] = (src / name).read_bytes()
            elif packed is not None and name in packed.getnames():
                out[dtype] = packed.extractfile(name).read()
    finally:
        if packed is not None:
            packed.close()
    if not out:
        raise ConfigError(f"{key}: no panel-<dtype>.jsonl for {', '.join(p.workload.dtypes)} in {str(src)!r} or its "
                          f"panels.tar.xz")
    return out


def folder_panels(folder: str | Path) -> dict[str, bytes]:
    """A campaign folder's panel files by dtype (panel-<dtype>.jsonl, or packed in its panels.tar.xz), whatever its
    plan; ConfigError naming the folder when it holds none."""
    src = Path(folder)
    out = {p.name[len("panel-"):-len(".jsonl")]: p.read_bytes() for p in sorted(src.glob("panel-*.jsonl"))}
    if not out and (src / "panels.tar.xz").is_file():
        with tarfile.open(src / "panels.tar.xz") as packed:
            for name in packed.getnames():
                if name.startswith("panel-") and name.endswith(".jsonl"):
                    out[name[len("panel-"):-len(".jsonl")]] = packed.extractfile(name).read()
    if not out:
        raise ConfigError(f"{str(src)!r} holds no panel-<dtype>.jsonl and no panels.tar.xz with them: give a workload "
                          f"campaign's folder")
    return out


def panel_winners(cfg: RunConfig, p: Plan) -> dict[str, list[Genome]]:
    """workload.panel_winners_from: by dtype, the genomes of an earlier campaign's panel that were fastest on some
    training shape, fastest on the most shapes first."""
    if not cfg.workload.panel_winners_from:
        return {}
    out = {}
    problem = registry.load("problem", cfg.problem)
    for dtype, text in panel_texts(cfg.workload.panel_winners_from, p,
                                   "config key 'workload.panel_winners_from'").items():
        genomes, times = read_panel(text)
        now = (today(problem, genomes[gid]) for gid in learn.winners(times))
        out[dtype] = list(dict.fromkeys(g for g in now if g is not None))
    return out


def panel_results(cfg: RunConfig, p: Plan) -> dict[str, dict[str, dict[str, Any]]]:
    """workload.panel_times_from: by dtype, an earlier campaign's panel results (JSON) of the genomes it timed
    correct, by genome id."""
    if not cfg.workload.panel_times_from:
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    problem = registry.load("problem", cfg.problem)
    for dtype, text in panel_texts(cfg.workload.panel_times_from, p,
                                   "config key 'workload.panel_times_from'").items():
        entries = [json.loads(line) for line in text.decode().splitlines() if line.strip()]
        out[dtype] = {}
        for e in entries:   # keyed by the genome's id today, so that a gene added since does not retime it
            g = today(problem, Genome.from_json(e["genome"]))
            if g is not None and e["result"]["status"] == "ok":
                out[dtype][g.id] = dict(e["result"], candidate_id=g.id)
    return out


def panel_cases(cfg: RunConfig, p: Plan, dtype: str) -> list[Case]:
    """A dtype's training cases, and the extra shape set's (never a held-out case)."""
    cases = [c for c in (*p.split.train, *p.more) if c.dtype == dtype]
    if cfg.workload.extra_train:
        problem = registry.load("problem", cfg.problem)
        extra = [Case(s, dtype) for s in build.shapes_of(problem, cfg.workload.extra_train,
                                                          "config key 'workload.extra_train'")]
        clash = [c.key for c in extra if c in set(p.split.heldout)]
        if clash:
            raise ConfigError(f"config key 'workload.extra_train': {clash[0]} is a held-out shape")
        cases += [c for c in extra if c not in cases]
    return cases


def table_genomes(cfg: RunConfig, dtype: str) -> list[Genome]:
    """The genomes a dispatch table (workload.panel_from) uses for a dtype, as this problem's genomes today."""
    problem = registry.load("problem", cfg.problem)
    return table_seeds(cfg.workload.panel_from, problem, problem.space, "workload.panel_from", dtype)


def twin_values(value: Any) -> list[GeneValue]:
    """workload.panel_twins' value for one gene: one value, or a list of them."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def twins(space: GeneSpace, genomes: Sequence[Genome], values: Mapping[str, Any]) -> list[Genome]:
    """Each genome with one of `values`' genes set to one of its values, where that makes a new, feasible genome."""
    out: list[Genome] = []
    for g in genomes:
        for name, value in values.items():
            for v in twin_values(value):
                twin = Genome.of({**g.gene_dict, name: v}, g.patch_dict)
                if twin not in genomes and twin not in out and space.why_infeasible(twin.gene_dict) is None:
                    out.append(twin)
    return out


def today(problem: Any, genome: Genome) -> Genome | None:
    """An earlier panel's genome in the problem's space today (a gene added since at its default, which keeps the
    binary: templates keep old genomes' meaning when they grow); None when it no longer fits the space."""
    return render.adapt(genome.gene_dict, genome.patch_dict, problem)[0]


def read_panel(path: Path | bytes) -> tuple[dict[str, Genome], dict[str, dict[str, float]]]:
    """(genomes by id, times[case][genome id]) of one panel file (or its bytes); failed genomes give no times."""
    genomes, pairs = {}, []
    for line in (path.decode() if isinstance(path, bytes) else path.read_text()).splitlines():
        entry = json.loads(line)
        genome = Genome.from_json(entry["genome"])
        genomes[genome.id] = genome
        if entry["result"]["status"] == "ok":
            pairs.append((genome.id, entry["result"]["times_us"]))
    return genomes, learn.times_of(pairs)
