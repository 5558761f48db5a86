"""The numbers a run logs to MLflow, as plain functions: a candidate's metrics, the run's accounting as metrics,
summary.json, and the tags that say where its numbers come from. Only true numbers: a fitness only where one was
measured, no metric that is zero, and what a run did not spend (a replay's GPU and compile seconds, a simulated
pool's time) named for its source."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .mlflow_store import safe_key
from ..protocols import EvaluatorInfo, RunSummary
from ..types import EvalResult, Status


def candidate_metrics(generation: int, result: EvalResult, replay: bool = False) -> dict[str, float]:
    """Everything numeric about one evaluation: fitness (a measured candidate's only), per-case times and bandwidth,
    ptxas facts per dtype. GPU and compile seconds that this run did not spend (a replay's, the recording's) are
    named recorded_*; zeros are left out."""
    rec = "recorded_" if replay else ""
    values: dict[str, float] = {"generation": generation, f"{rec}gpu_s": result.gpu_s}
    if result.status is Status.OK:
        values["fitness"] = result.fitness
    per_case = {"time_us": result.times_us, "iqr_us": result.iqr_us, "baseline_us": result.baseline_us,
                "gbps": result.gbps}
    for prefix, by_case in per_case.items():
        values.update({f"{prefix}.{safe_key(case)}": v for case, v in by_case.items()})
    for dtype, info in result.build.items():
        facts = {"registers": info.registers, "spill_stores": info.spill_stores, "shared_bytes": info.shared_bytes,
                 f"{'recorded_' if info.cached else ''}compile_s": info.compile_s}
        values.update({f"{fact}.{safe_key(dtype)}": v for fact, v in facts.items() if v is not None})
    return {k: v for k, v in values.items() if v or k in ("fitness", "generation")}


def accounting_metrics(books: Mapping[str, Any], results: Sequence[EvalResult], replay: bool) -> dict[str, float]:
    """The scalar part of the run's accounting (accounting.py) as metrics; the rest is in summary.json. As with
    every parent metric, a zero is not logged (no LLM, no GPU worker in a replay, an empty queue). What this run
    did not spend carries its source in its name: simulated_* for a simulated pool's workers (recorded latencies),
    recorded_compile_s_host for the compile seconds of a replay's recorded builds (the recording machine's)."""
    if not books:
        return {}
    sim = "simulated_" if books.get("simulated") else ""
    out = {f"{sim}gpu_s.{safe_key(name)}": s for name, s in books["gpu_s_per_worker"].items()}
    out |= {"compile_s_host": books["compile_s_host"], "queue_depth_mean": books["queue_depth"]["mean"],
            "queue_depth_max": books["queue_depth"]["max"], "worker_respawns": books["respawns"],
            "llm_tokens_prompt": books["llm_tokens"]["prompt"],
            "llm_tokens_completion": books["llm_tokens"]["completion"],
            f"{sim}timed_per_held_gpu_minute": books["timed_per_held_gpu_minute"],
            "cut_total": books.get("cut", 0),
            f"{sim}evaluated_per_gpu_minute": books.get("evaluated_per_gpu_minute", 0),
            "gpu_idle_compile_s": books.get("gpu_idle_compile_s", 0),
            "gpu_idle_compile_fraction": books.get("gpu_idle_compile_fraction", 0)}
    if any(books["gpu_s_per_worker"].values()):   # a replay's inline "worker" is no GPU: it held none
        out[f"{sim}workers"] = books["workers"]
    if replay:
        out["recorded_compile_s_host"] = sum(info.compile_s or 0.0 for r in results for info in r.build.values()
                                             if info.cached)
    return {k: float(v) for k, v in out.items() if v}


def source_tags(evaluator: EvaluatorInfo) -> dict[str, str]:
    """Where a run's numbers come from: the evaluator kind and the host that ran it on every run; a live run's
    machine as kf.env.*, and a replay's recording as kf.recording with the recording machine's fingerprint as
    kf.recorded.* (so that nothing names the recording's GPU as this run's environment)."""
    fp = dict(evaluator.fingerprint)
    tags = {"kf.evaluator": evaluator.kind, "kf.host": fp.pop("ran_on_host", "")}
    if evaluator.kind != "replay":
        return tags | {f"kf.env.{key}": value for key, value in fp.items()}
    env = {k: fp.pop(k) for k in ("why_replay",) if k in fp}
    return (tags | {f"kf.env.{k}": v for k, v in env.items()} | {f"kf.recorded.{k}": v for k, v in fp.items()}
            | {"kf.recording": fp.get("recording", ""), "kf.data": evaluator.replay_note()})


def summary_record(summary: RunSummary, evaluator: EvaluatorInfo | None = None) -> dict[str, Any]:
    """summary.json: how the run ended, the best candidate with its genes and per-case times, the hall of fame.
    A replay's times and GPU-seconds are the recording's: they are named recorded_* and the record says so."""
    rec = "recorded_" if evaluator is not None and evaluator.kind == "replay" else ""
    best = None
    if summary.best is not None:
        candidate, result = summary.best
        best = {"candidate_id": candidate.id, "fitness": result.fitness, "genes": candidate.genome.gene_dict,
                "patch": candidate.genome.patch_dict, f"{rec}times_us": dict(result.times_us),
                f"{rec}baseline_us": dict(result.baseline_us), f"{rec}gbps": dict(result.gbps)}
    head = {"evaluator": evaluator.kind, "data": evaluator.replay_note() or "measured live"} if evaluator else {}
    return {"run_id": summary.run_id, **head, "generations": summary.generations, "evaluations": summary.evaluations,
            "stop_reason": summary.stop_reason, "wall_s": summary.wall_s, f"{rec}gpu_s": summary.gpu_s, "best": best,
            "hall_of_fame": [{"candidate_id": c.id, "fitness": r.fitness} for c, r in summary.hall_of_fame],
            f"{rec}timed_per_gpu_minute": summary.timed_per_gpu_minute, "finalists": list(summary.finalists),
            "accounting": dict(summary.accounting)}
