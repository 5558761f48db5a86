"""Prompts for the LLM operators, filled from the templates in prompts/ with what the run knows about a parent:
its source and genes, its measurements and ptxas report, its best and failed relatives, and the lessons."""
from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Mapping, Sequence

from ..evo.protocols import OperatorContext
from ..evo.regions import regions
from ..evo.types import Candidate, Case, EvalResult, Status
from . import llm_edits
from .llm_client import CHARS_PER_TOKEN, estimate_tokens

MAX_SOURCE_CHARS = 40_000     # the RMSNorm template renders to ~16 k; a larger one is cut with a note
MAX_MESSAGE_CHARS = 3_000     # a compiler log or mismatch summary in a repair prompt
MAX_REASON_CHARS = 300        # one failed relative's reason
MAX_LESSONS_CHARS = 6_000
# The prompt budget's trimming rule: while a prompt's estimated tokens exceed the agent's max_prompt_tokens, these
# parts are cut from their end, in this order, each only as far as needed; the source, genes, measurements and
# reply format are never cut, and a prompt that still does not fit is not sent (an llm_error child says so).
TRIM_REWRITE = ("lessons", "failed", "best")
TRIM_REPAIR = ("message",)
PROMPTS = Path(__file__).resolve().parent / "prompts"   # beside this module in a wheel and in an editable install


def template(name: str) -> string.Template:
    return string.Template((PROMPTS / f"{name}.md").read_text())


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def fit(tpl: string.Template, fields: dict[str, str], budget_tokens: int | None, order: Sequence[str]) -> str:
    """The template filled, with the parts in `order` cut (each from its end, as little as needed) to fit."""
    text = tpl.substitute(fields)
    for key in order if budget_tokens is not None else ():
        over = estimate_tokens(text) - budget_tokens
        if over <= 0:
            break
        keep = max(0, len(fields[key]) - math.ceil(over * CHARS_PER_TOKEN) - 60)   # room for the cut note
        fields = fields | {key: clip(fields[key], keep)}
        text = tpl.substitute(fields)
    return text


def dtype_of(context: OperatorContext, result: EvalResult | None) -> str:
    keys = list(result.build) if result and result.build else []
    keys += [Case.parse(k).dtype for k in (result.times_us if result else {})]
    return keys[0] if keys else context.problem.dtypes[0]


def source(context: OperatorContext, candidate: Candidate, result: EvalResult | None) -> str:
    return clip(context.render(candidate, dtype_of(context, result)), MAX_SOURCE_CHARS)


def genes(context: OperatorContext, candidate: Candidate) -> str:
    values = candidate.genome.gene_dict
    return "\n".join(f"- {g.name} = {values[g.name]!r} (choices {list(g.choices)}; {g.doc})"
                     for g in context.problem.space.genes)


def measurements(result: EvalResult | None, copy_gbps: float) -> str:
    if result is None or not result.times_us:
        return "not measured" + (f" ({result.status.value})" if result else "")
    rows = ["| case | µs | GB/s | % of copy | baseline µs | speedup |", "|---|---|---|---|---|---|"]
    for key, t in result.times_us.items():
        gbps = result.gbps.get(key, math.nan)
        pct = f"{100 * gbps / copy_gbps:.0f}%" if copy_gbps > 0 and math.isfinite(gbps) else "n/a"
        base = result.baseline_us.get(key, math.nan)
        rows.append(f"| {key} | {t:.2f} | {gbps:.0f} | {pct} | {base:.2f} | {base / t:.3f}x |")
    return "\n".join(rows)


def ptxas(result: EvalResult | None) -> str:
    if result is None or not result.build:
        return "none (not compiled here, or replayed without a report)"
    return "\n".join(f"- {dt}: {b.registers} registers, {b.spill_stores} B spill stores, {b.spill_loads} B spill "
                     f"loads, {b.shared_bytes} B shared" for dt, b in result.build.items())


def best(results: Mapping[str, tuple[Candidate, EvalResult]], count: int) -> str:
    ranked = sorted((pair for pair in results.values() if pair[1].status is Status.OK),
                    key=lambda pair: (-pair[1].fitness, pair[0].id))[:count]
    return "\n".join(_line(c, r) for c, r in ranked) or "- none yet"


def failed(results: Mapping[str, tuple[Candidate, EvalResult]], parent: Candidate, count: int) -> str:
    """The latest failures among the parent's relatives (its children and siblings), else the latest overall."""
    fails = [pair for pair in results.values() if pair[1].status is not Status.OK]
    family = set(parent.parents) | {parent.id}
    close = [p for p in fails if family & set(p[0].parents)]
    picked = (close or fails)[-count:]
    return "\n".join(_line(c, r) for c, r in reversed(picked)) or "- none"


def _line(c: Candidate, r: EvalResult) -> str:
    patched = ", ".join(name for name, _ in c.genome.patch if not name.startswith("!")) or "none"
    what = f"fitness {r.fitness:.4f}" if r.status is Status.OK else \
        f"{r.status.value}: {' '.join(r.message.split())[:MAX_REASON_CHARS] or 'no message'}"
    return f"- {c.id} ({c.operator}; patched regions: {patched}; genes {c.genome.gene_dict}): {what}"


def common(context: OperatorContext, candidate: Candidate, result: EvalResult | None) -> dict[str, str]:
    """The fields both prompts share."""
    return {"problem": context.problem.name, "description": context.problem.description,
            "regions": ", ".join(regions(context.problem.template())), "genes": genes(context, candidate),
            "source": source(context, candidate, result), "format": llm_edits.FORMAT}


def rewrite(context: OperatorContext, parent: Candidate, count: int, budget_tokens: int | None = None) -> str:
    result = context.results.get(parent.id, (None, None))[1]
    fp = context.fingerprint
    copy_gbps = float(fp.get("copy_gbps") or 0)
    fields = common(context, parent, result) | {
        "parent_id": parent.id, "parent_operator": parent.operator, "gpu": fp.get("gpu", "an unknown GPU"),
        "evaluator": "replayed measurements" if "recording" in fp else "measured live", "copy_gbps": f"{copy_gbps:.0f}",
        "fitness": f"{result.fitness:.4f}" if result else "n/a", "baseline": fp.get("baseline", "?"),
        "measurements": measurements(result, copy_gbps), "ptxas": ptxas(result),
        "best": best(context.results, count), "failed": failed(context.results, parent, count),
        "lessons": clip(context.lessons, MAX_LESSONS_CHARS) or "none yet"}
    return fit(template("rewrite"), fields, budget_tokens, TRIM_REWRITE)


def repair(context: OperatorContext, failed_one: Candidate, result: EvalResult, attempt: int,
           max_attempts: int, budget_tokens: int | None = None) -> str:
    logs = [b.log for b in result.build.values() if b.log and result.status is Status.COMPILE_ERROR]
    message = "\n".join(dict.fromkeys([result.message, *logs]))   # the evaluator may repeat the log in message
    fields = common(context, failed_one, result) | {
        "patched": ", ".join(name for name, _ in failed_one.genome.patch), "status": result.status.value,
        "message": clip(message.strip() or "no details", MAX_MESSAGE_CHARS), "attempt": str(attempt),
        "max_attempts": str(max_attempts)}
    return fit(template("repair"), fields, budget_tokens, TRIM_REPAIR)


SYSTEM = "You are an expert CUDA and PTX performance engineer. You reply with one strictly formatted code edit."


def messages(prompt: str) -> Sequence[Mapping[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def user_budget(max_prompt_tokens: int) -> int:
    """The user message's share of an agent's prompt budget (the system message takes the rest)."""
    return max_prompt_tokens - estimate_tokens(SYSTEM)
