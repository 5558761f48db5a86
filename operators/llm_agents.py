"""Which agent (endpoint + model) makes the next LLM child, and whether the run may still pay for it: agent shares
that follow success per dollar and per GPU-second, and one dollar ledger shared by all LLM operators of a run."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..evo.types import Candidate, EvalResult, Status
from .llm_client import Agent

USAGE_NOTE = "llm/usage.json"
CHILD_COST_FLOOR = 0.001   # dollars a child counts as costing at least, so free local agents compare by success
FLOOR_SHARE = 0.05         # every usable agent keeps at least this share, so a recovered endpoint is noticed


@dataclass
class Ledger:
    """Dollars spent on LLM calls in this run, by every LLM operator together."""

    spent_usd: float = 0.0
    calls: int = 0


@dataclass(frozen=True)
class AgentOutcome:
    agent: str
    success: bool
    cost_usd: float
    gpu_s: float


def outcomes(results: Mapping[str, tuple[Candidate, EvalResult]], operator: str,
             needs_improvement: bool) -> list[AgentOutcome]:
    """The outcome of every child `operator` made in this run, read from its usage note and its result.
    Success is status ok and, with needs_improvement, a fitness above its best parent's."""
    out = []
    for candidate, result in results.values():
        if candidate.operator != operator or USAGE_NOTE not in candidate.notes:
            continue
        usage = json.loads(candidate.notes[USAGE_NOTE])
        success = result.status is Status.OK
        if needs_improvement and success:
            parents = [results[p][1].fitness for p in candidate.parents if p in results]
            success = result.fitness > max(parents, default=0.0)
        out.append(AgentOutcome(usage["agent"], success, float(usage["cost_usd"]), result.gpu_s))
    return out


class AgentPool:
    """The usable agents and their shares. A share is weight x (successes + 1) / (dollars + GPU-seconds priced
    at gpu_usd_per_hour + a floor per child + 2 floors): success per dollar, where GPU time counts as money."""

    def __init__(self, agents: Sequence[Agent], gpu_usd_per_hour: float):
        self.all = list(agents)
        self.gpu_usd_per_s = gpu_usd_per_hour / 3600.0
        self.problems = {a.name: why for a in self.all if (why := a.why_unusable())}
        self.usable = [a for a in self.all if a.name not in self.problems]
        self.shares = self._normalise({a.name: a.weight for a in self.usable})

    def why_none(self) -> str | None:
        if not self.all:
            return "no agents are configured (option agents)"
        if not self.usable:
            return "no usable agent: " + "; ".join(self.problems.values())
        return None

    def learn(self, seen: Sequence[AgentOutcome]) -> None:
        values = {}
        for agent in self.usable:
            mine = [o for o in seen if o.agent == agent.name]
            spent = sum(o.cost_usd + o.gpu_s * self.gpu_usd_per_s for o in mine)
            spent += CHILD_COST_FLOOR * (len(mine) + 2)
            values[agent.name] = agent.weight * (sum(o.success for o in mine) + 1) / spent
        self.shares = self._normalise(values)

    def _normalise(self, values: Mapping[str, float]) -> dict[str, float]:
        if not values:
            return {}
        total = sum(values.values())
        floor = min(FLOOR_SHARE, 1.0 / len(values))
        raw = {k: v / total for k, v in values.items()}
        lifted = {k: max(v, floor) for k, v in raw.items()}
        norm = sum(lifted.values())
        return {k: v / norm for k, v in lifted.items()}

    def pick(self, rng: random.Random) -> Agent:
        return rng.choices(self.usable, weights=[self.shares[a.name] for a in self.usable])[0]
