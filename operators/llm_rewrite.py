"""LLM rewrite: a model rewrites one editable region of the parent's kernel, shown the parent's source, genes,
measurements, ptxas report, relatives and the lessons; the child keeps the parent's genes (one hybrid genome)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..evo.types import Candidate
from . import llm_prompts
from .llm_base import LlmOperator


class LlmRewrite(LlmOperator):
    """Options: those of LlmOperator, and relatives (how many best and how many failed relatives the prompt shows)."""

    name = "llm_rewrite"
    needs_improvement = True   # an agent's rewrite counts as a success only when it beats its parent

    def __init__(self, agents: Sequence[Mapping[str, Any]] = (), budget_usd: float | None = None,
                 gpu_usd_per_hour: float = 3.0, relatives: int = 3):
        super().__init__(agents, budget_usd, gpu_usd_per_hour)
        if relatives < 0:
            raise ValueError(f"relatives must be >= 0, got {relatives}")
        self.relatives = relatives

    def prompt(self, parent: Candidate, budget_tokens: int | None = None) -> str:
        return llm_prompts.rewrite(self.context, parent, self.relatives, budget_tokens)
