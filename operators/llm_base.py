"""What the LLM operators share: their agents, the run's dollar ledger, one chat call per child, and the child a
reply becomes (an applied edit, or an `invalid_patch` / `llm_error` candidate) with its notes."""
from __future__ import annotations

import json
import random
from typing import Any, Mapping, Sequence

from ..evo.protocols import OperatorContext
from ..evo.regions import regions
from ..evo.types import Candidate, GeneSpace, Genome, Status
from . import llm_edits, llm_prompts
from .llm_agents import USAGE_NOTE, AgentPool, Ledger, outcomes
from .llm_client import Agent, ChatClient, Reply

# Patch keys that no template has: they keep a failed call's or edit's text in the genome, so that its id is unique
# and it can never be rendered or compiled (the proposer never breeds from such a candidate).
UNAPPLIED = "!unapplied"
LLM_ERROR = "!llm_error"
LEDGER = "llm.ledger"    # key of the run-wide ledger in OperatorContext.shared


class LlmOperator:
    """Base of llm_rewrite and llm_repair. Options (config `search.operators.<name>`): agents (a list of
    {name, base_url, model, api_key_env | no_key, max_completion_tokens, max_prompt_tokens, max_concurrent,
    timeout_s, temperature, top_p, seed, reasoning_effort, weight, price_in_per_mtok, price_out_per_mtok}: see
    llm_client.Agent), budget_usd (the most the run may spend on LLM calls, counted over every LLM operator;
    None: no limit) and gpu_usd_per_hour (what a GPU-second costs when agents are compared)."""

    name = "llm"
    arity = 1
    needs_improvement = False   # does a child count as a success for its agent only if it beats its parent?

    def __init__(self, agents: Sequence[Mapping[str, Any]] = (), budget_usd: float | None = None,
                 gpu_usd_per_hour: float = 3.0):
        if budget_usd is not None and budget_usd < 0:
            raise ValueError(f"budget_usd must be >= 0, got {budget_usd}")
        self.pool = AgentPool([Agent.of(a, f"agents[{i}]") for i, a in enumerate(agents)], gpu_usd_per_hour)
        self.budget_usd = budget_usd
        self.client = ChatClient()
        self.ledger = Ledger()
        self.context: OperatorContext | None = None
        self.unavailable: str | None = self.pool.why_none()

    def attach(self, context: OperatorContext) -> None:
        self.context = context
        self.ledger = context.shared.setdefault(LEDGER, self.ledger)
        self.pool.learn(outcomes(context.results, self.name, self.needs_improvement))
        self.unavailable = self.pool.why_none() or self._spent()

    def _spent(self) -> str | None:
        if self.budget_usd is not None and self.ledger.spent_usd >= self.budget_usd:
            return f"LLM budget of ${self.budget_usd:g} spent (${self.ledger.spent_usd:.4f} in this run)"
        return None

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        return self.make([Candidate(p) for p in parents], space, rng).genome

    def make(self, parents: Sequence[Candidate], space: GeneSpace, rng: random.Random) -> Candidate:
        parent = parents[0]
        why = self.unavailable or self._spent() or (None if self.context else f"{self.name} is not attached to a run")
        if why:
            return failed(parent, Status.LLM_ERROR, why, {}, LLM_ERROR, why, rng)
        agent = self.pool.pick(rng)
        prompt = self.prompt(parent, llm_prompts.user_budget(agent.max_prompt_tokens))
        return self.child(parent, prompt, self._paid(self.client.chat(agent, llm_prompts.messages(prompt))), rng)

    def make_many(self, parent_sets: Sequence[Sequence[Candidate]], space: GeneSpace,
                  rng: random.Random) -> list[Candidate]:
        """Several children with their calls in flight together (each agent's max_concurrent at most). Agents,
        prompts and children are made in order on this thread, so a seed gives the same children as make()."""
        asked, out = [], []
        for parents in parent_sets:
            why = self.unavailable or self._spent() or (None if self.context else f"{self.name} is not attached")
            if why:
                asked.append((parents[0], None, why))
                continue
            agent = self.pool.pick(rng)
            budget = llm_prompts.user_budget(agent.max_prompt_tokens)
            asked.append((parents[0], agent, self.prompt(parents[0], budget)))
        sent = [(agent, llm_prompts.messages(prompt)) for _, agent, prompt in asked if agent is not None]
        replies = iter(self.client.chat_many(sent))
        for parent, agent, prompt in asked:
            if agent is None:
                out.append(failed(parent, Status.LLM_ERROR, prompt, {}, LLM_ERROR, prompt, rng))
            else:
                out.append(self.child(parent, prompt, self._paid(next(replies)), rng))
        return out

    def prompt(self, parent: Candidate, budget_tokens: int | None = None) -> str:
        raise NotImplementedError

    def _paid(self, reply: Reply) -> Reply:
        self.ledger.spent_usd += reply.cost_usd
        self.ledger.calls += 1
        return reply

    def child(self, parent: Candidate, prompt: str, reply: Reply, rng: random.Random) -> Candidate:
        """The reply's edit applied to the parent's code (genes kept), or a candidate that records why not."""
        notes = {"llm/prompt.md": prompt, USAGE_NOTE: json.dumps(reply.usage(), indent=2)}
        if reply.error is not None:
            message = f"{reply.agent} ({reply.model}): {reply.error}"
            return failed(parent, Status.LLM_ERROR, message, notes, LLM_ERROR, message, rng)
        notes["llm/reply.md"] = reply.text
        current = regions(self.context.problem.template()) | parent.genome.patch_dict
        try:
            edit = llm_edits.parse(reply.text)
            new = llm_edits.apply(edit, current)
        except llm_edits.EditError as exc:
            return failed(parent, Status.INVALID_PATCH, str(exc), notes, UNAPPLIED, reply.text, rng)
        notes["llm/diff.patch"] = llm_edits.diff(edit.region, current[edit.region], new)
        return Candidate(Genome.of(parent.genome.gene_dict, parent.genome.patch_dict | {edit.region: new}),
                         notes=notes)


def failed(parent: Candidate, status: Status, message: str, notes: Mapping[str, str], key: str, text: str,
           rng: random.Random) -> Candidate:
    """A child whose outcome is known: the parent's genes and patch plus `text` under a key no template has, and a
    nonce from rng, so that two identical failures still get two ids and both are recorded."""
    patch = parent.genome.patch_dict | {key: f"{text}\n[{rng.getrandbits(32):08x}]"}
    return Candidate(Genome.of(parent.genome.gene_dict, patch), notes=dict(notes), failure=(status.value, message))
