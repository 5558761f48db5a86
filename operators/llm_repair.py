"""LLM repair: a patched candidate that failed to compile or failed the correctness check goes back to a model with
the compiler log or the mismatch summary, a bounded number of times per lineage."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..evo.types import Candidate, EvalResult, Status
from . import llm_prompts
from .llm_base import LlmOperator

REPAIRABLE = (Status.COMPILE_ERROR, Status.INCORRECT)


class LlmRepair(LlmOperator):
    """Options: those of LlmOperator, max_attempts (repairs in a row along one lineage) and max_per_generation
    (repair children per generation; they count inside the generation's population of children)."""

    name = "llm_repair"

    def __init__(self, agents: Sequence[Mapping[str, Any]] = (), budget_usd: float | None = None,
                 gpu_usd_per_hour: float = 3.0, max_attempts: int = 2, max_per_generation: int = 4):
        super().__init__(agents, budget_usd, gpu_usd_per_hour)
        if max_attempts < 1 or max_per_generation < 1:
            raise ValueError(f"max_attempts and max_per_generation must be >= 1, got {max_attempts}, "
                             f"{max_per_generation}")
        self.max_attempts, self.max_per_generation = max_attempts, max_per_generation

    def attempts(self, candidate: Candidate) -> int:
        """Repairs already made along this candidate's lineage: its chain of llm_repair ancestors."""
        n, results = 0, self.context.results if self.context else {}
        while candidate.operator == self.name and candidate.parents and candidate.parents[0] in results:
            n += 1
            candidate = results[candidate.parents[0]][0]
        return n

    def choose(self, results: Sequence[tuple[Candidate, EvalResult]]) -> list[Candidate]:
        picked = [c for c, r in results if r.status in REPAIRABLE and c.genome.patch and c.failure is None
                  and self.attempts(c) < self.max_attempts]
        return picked[:self.max_per_generation]

    def prompt(self, parent: Candidate, budget_tokens: int | None = None) -> str:
        result = self.context.results[parent.id][1]
        return llm_prompts.repair(self.context, parent, result, self.attempts(parent) + 1, self.max_attempts,
                                  budget_tokens)
