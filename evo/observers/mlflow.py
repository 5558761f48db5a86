"""MLflow tracking of evolutionary runs (a parent run per run with its candidate table, and a child run per candidate
with tracking.child_runs), written from a background thread so that the loop never waits on SQLite. Beside it:
mlflow_store.py, the store's plumbing (where, limits, the writer, the UI); mlflow_numbers.py, the numbers it logs;
mlflow_view.py, what the UI shows of them."""
from __future__ import annotations

import functools
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from . import lineage, lineage_image, mlflow_view as view
from .mlflow_numbers import accounting_metrics, candidate_metrics, source_tags, summary_record
from .mlflow_store import (Metric, MlflowClient, Param, RunTag, TrackingError, Writer, batches, check_store,
                           experiment_id, flatten, log_table_file, metrics_of, open_tracking, params_of, prepare_ui,
                           tags_of, tracking_uri)
from ..config import ConfigError
from .provenance import git_tags
from ..config import RunConfig
from ..evaluate import render
from ..prior import read_table, search_all
from ..protocols import GenerationStats, Problem, RunInfo, RunSummary
from ..types import Candidate, EvalResult, Status

# Generations between lineage drawings on the parent run (lineage/), and one more at the end.
LINEAGE_EVERY = 3

# The note an LLM operator leaves on its child: agent, model, tokens, cost and latency of the call (no key in it).
LLM_USAGE_NOTE = "llm/usage.json"
LLM_FIGURES = ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s")


def llm_usage(candidate: Candidate) -> dict[str, Any]:
    """The LLM call behind a candidate ({} for the others): {agent, model, prompt_tokens, ...}."""
    text = candidate.notes.get(LLM_USAGE_NOTE)
    return json.loads(text) if text else {}


class MlflowObserver:
    """Observer that mirrors a run into MLflow. Every method only enqueues work, except on_generation and on_end,
    which wait for it so that the store is consistent at generation boundaries."""

    def __init__(self, problem: Problem, config: RunConfig):
        self.problem = problem
        self.tracking = config.tracking
        self.store = tracking_uri(config.tracking) or Path(config.tracking.store).resolve()   # relative to the CWD
        self.monitor: Any = None   # MLflow's system metrics monitor (GPU runs)
        self.artifacts = Path(config.tracking.artifacts).resolve()
        self.experiment = config.tracking.experiment or problem.name
        self.dtypes = tuple(config.dtypes or problem.dtypes[:1])   # rendered when a result has no build info
        self.child_runs = config.tracking.child_runs
        self.nonzero: set[str] = set()    # parent metrics that were ever non-zero (zero-only ones are not logged)
        self.child_ids: dict[str, str] = {}   # candidate id -> its child run (child_runs only)
        self.writer: Writer | None = None
        self.run: RunInfo | None = None
        self.offline = False   # the store failed its check and tracking.optional is set: the journal only
        # Set and used on the writer thread only.
        self.client: MlflowClient | None = None
        self.experiment_id = ""
        self.parent_id = ""
        self.seen: list[tuple[Candidate, EvalResult]] = []   # every result so far, for the lineage
        self.logged: set[str] = set()     # on resume: candidates whose child runs are complete already
        self.tabled: set[str] = set()     # candidates in the table (a kill can land after a child, before the table)
        self.table: dict[str, list] = {}  # the candidate table so far, {column: cells}, written whole each time
        self.last_generation = -1         # on resume: the last generation whose metrics are logged
        # LLM calls' figures, this generation's and the run's (added up on the loop's thread).
        self.llm_generation = dict.fromkeys(LLM_FIGURES, 0.0)
        self.llm_run = dict.fromkeys(LLM_FIGURES, 0.0)

    def preflight(self, run_id: str, resumed: bool) -> bool:
        """Check the store before the run folder and the first candidate, within mlflow_store.STORE_CHECK_S: one
        that cannot be written stops the run now (or, with tracking.optional, is left out: returns False). A run id
        that the store already holds is refused unless resumed, whatever out_dir that run used."""
        try:
            out_dir = check_store(self.tracking, self.experiment, self.artifacts, self.problem.name, run_id)
        except Exception as exc:   # noqa: BLE001 - whatever failed is named in one line
            self.writer_closed_by_error(exc)
            self.offline = True
            return False
        if out_dir is not None and not resumed:
            raise ConfigError(f"run id {run_id!r} already exists in the MLflow store {self.store} (a run of out_dir "
                              f"{out_dir}); a run id names one run in the store as in out_dir: choose another "
                              f"--run-id, or continue that run with `kernel-factory resume {run_id} --runs {out_dir}`")
        return True

    def on_start(self, run: RunInfo) -> None:
        if self.offline:
            return
        self.run = run
        self.writer = Writer()
        self.writer.submit(self._start)
        self.writer.drain()   # a store that cannot be written fails here, once, before anything is evaluated
        if self.writer.first_error is None:
            return
        err, self.writer = self.writer.first_error, None
        self.writer_closed_by_error(err)

    def writer_closed_by_error(self, err: BaseException) -> None:
        first_line = (str(err).strip().splitlines() or [""])[0][:300]
        message = f"MLflow tracking at {self.store} cannot be written: {type(err).__name__}: {first_line}"
        if not self.tracking.optional:
            raise TrackingError(message + " (fix the store, set tracking.uri, or set tracking.optional: true to "
                                          "run with the journal only)")
        print(f"mlflow: {message}; tracking.optional is set, so this run is recorded in its journal only",
              file=sys.stderr)

    def on_results(self, generation: int, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        if self.writer is None:
            return
        self.seen.extend(results)
        for usage in filter(None, (llm_usage(c) for c, _ in results)):
            for figure in LLM_FIGURES:
                self.llm_generation[figure] += usage[figure]
                self.llm_run[figure] += usage[figure]
        for candidate, result in results:
            self.writer.submit(functools.partial(self._log_candidate, generation, candidate, result))

    def on_generation(self, stats: GenerationStats) -> None:
        if self.writer is None:
            return
        llm = {f"llm_{k}": v for k, v in self.llm_generation.items()}
        self.llm_generation = dict.fromkeys(LLM_FIGURES, 0.0)
        self.writer.submit(functools.partial(self._log_generation, stats, llm))
        self.writer.submit(functools.partial(self._log_table, tuple(self.seen)))
        self.writer.drain()
        if stats.generation and stats.generation % LINEAGE_EVERY == 0:
            # Queued after the drain, so the drawing overlaps the next generation's evaluation.
            self.writer.submit(functools.partial(self._log_lineage, tuple(self.seen), stats.best_id))

    def on_end(self, summary: RunSummary) -> None:
        if self.writer is None:
            return
        if not self.run.resumed and not self.seen and summary.stop_reason in ("error", "interrupted"):
            # Stopped during start-up with nothing measured: the run folder goes (run.py), and so does the parent
            # run, so that the run id is free again rather than refused as one the store holds.
            self.writer.submit(self._forget)
            self.writer.close()
            return
        best_id = summary.best[0].id if summary.best else None
        self.writer.submit(functools.partial(self._log_lineage, tuple(self.seen), best_id))
        self.writer.submit(functools.partial(self._finish, summary, {f"llm_{k}_total": v
                                                                     for k, v in self.llm_run.items()}))
        self.writer.close()
        if self.writer.first_error is not None:
            err = self.writer.first_error
            first_line = (str(err).strip().splitlines() or [""])[0]
            print(f"mlflow: {self.writer.failures} write(s) to {self.store} failed, so its record of run "
                  f"{summary.run_id} is incomplete (the run itself is not affected); first: "
                  f"{type(err).__name__}: {first_line}", file=sys.stderr)

    # ---- on the writer thread -----------------------------------------------------------------------------------

    def _log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[Param] = (),
                   tags: Sequence[RunTag] = ()) -> None:
        for m, p, t in batches(metrics, params, tags):
            # synchronous=True: otherwise MLFLOW_ENABLE_ASYNC_LOGGING in the environment would switch on the
            # async queue, which costs 20-35x per short run.
            self.client.log_batch(run_id, metrics=m, params=p, tags=t, synchronous=True)

    def _start(self) -> None:
        run = self.run
        self.client, uri = open_tracking(self.tracking)
        self.experiment_id = experiment_id(self.client, self.experiment, self.artifacts)
        if self._reattach():   # resume (preflight refuses a new run under an id the store holds)
            self._monitor(uri)
            return
        warm_runs = sorted(set(run.warm_start_from.values()))
        tags = {"kf.run_id": run.run_id, "kf.problem": run.problem, "kf.kind": "evolution",
                "kf.evaluator": run.evaluator.kind, "kf.evaluator_label": run.evaluator.label,
                "kf.cases_key": run.cases_key, "kf.prior_records": str(run.prior_records),
                "kf.warm_start": f"{len(run.warm_start)} genomes from earlier runs" if run.warm_start else "none",
                "kf.warm_start_ids": ",".join(run.warm_start), "kf.warm_start_runs": ",".join(warm_runs) or "none"}
        tags.update(source_tags(run.evaluator))
        tags.update(git_tags())
        self._prepare_experiment()
        parents = self.client.search_runs([self.experiment_id], view.PARENTS_FILTER, max_results=1000)
        tags |= {view.COLOUR_TAG: view.colour(len(parents)), view.NOTE_TAG: self._description(None)}
        name = view.run_name(run.seed, len(warm_runs), run.run_id)
        parent = self.client.create_run(self.experiment_id, run_name=name, tags=tags_of(tags))
        self.parent_id = parent.info.run_id
        self._monitor(uri)
        params = flatten(run.config) | {"seed": str(run.seed)}
        self._log_batch(self.parent_id, params=params_of(params))
        self.client.log_text(self.parent_id, json.dumps(run.config, indent=2, default=str), "config.json")

    def _forget(self) -> None:
        if self.monitor is not None:
            self.monitor.finish()
        if self.parent_id:
            self.client.delete_run(self.parent_id)

    def _monitor(self, uri: str) -> None:
        """MLflow's system metrics (GPU utilisation and memory through nvidia-ml-py, CPU, RAM) on the parent run,
        only while a GPU evaluator runs: a replay run has no GPU to watch."""
        if self.run.evaluator.kind != "gpu":
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        self.monitor = SystemMetricsMonitor(self.parent_id, resume_logging=self.run.resumed, tracking_uri=uri)
        self.monitor.start()

    def _prepare_experiment(self) -> None:
        """Experiment tags for the UI: the training-runs view, the start link's saved view, a description."""
        prepare_ui(self.client, self.experiment_id, self.run.problem)

    def _description(self, graph: Any, failures: Mapping[str, int] | None = None) -> str:
        run = self.run
        evaluator = {"kind": run.evaluator.kind, "label": run.evaluator.label,
                     "gpu": run.evaluator.fingerprint.get("gpu", "")}
        return view.description(run.problem, run.run_id, evaluator, graph, run.warm_start_from, failures or {})

    def _reattach(self) -> bool:
        """Continue this run id's parent run if the store has one (resume): keep its finished children and drop
        half-written ones (a kill can land between create_run and set_terminated); the journal re-sends those."""
        found = search_all(self.client, self.experiment_id, f"tags.`kf.run_id` = '{self.run.run_id}' "
                                                            "and tags.`kf.kind` = 'evolution'")
        if not found:
            return False
        self.parent_id = found[0].info.run_id
        self.client.update_run(self.parent_id, status="RUNNING")
        for child in search_all(self.client, self.experiment_id, f"tags.mlflow.parentRunId = '{self.parent_id}'"):
            if child.info.status == "FINISHED":
                self.logged.add(child.data.tags.get("kf.candidate_id", ""))
            else:
                self.client.delete_run(child.info.run_id)
        self.table = read_table(self.client, self.parent_id, numbers=False)
        self.tabled = set(self.table.get("candidate", []))
        history = self.client.get_metric_history(self.parent_id, "best_fitness")
        self.last_generation = max((m.step for m in history), default=-1)
        return True

    def _log_candidate(self, generation: int, candidate: Candidate, result: EvalResult) -> None:
        if not self.child_runs or candidate.id in self.logged:
            return
        tags = {"mlflow.parentRunId": self.parent_id, "kf.run_id": self.run.run_id, "kf.kind": "candidate",
                "kf.candidate_id": candidate.id, "kf.parent_ids": ",".join(candidate.parents),
                "kf.operator": candidate.operator, "kf.generation": str(generation),
                "kf.status": result.status.value, "kf.evaluator": self.run.evaluator.kind,
                "kf.host": self.run.evaluator.fingerprint.get("ran_on_host", "")}
        if result.flags:
            tags["kf.flags"] = " | ".join(result.flags)
        usage = llm_usage(candidate)
        if usage:
            tags |= {"kf.llm_agent": usage["agent"], "kf.llm_model": usage["model"]}
        links = [f"[{p[:8]}](#/experiments/{self.experiment_id}/runs/{self.child_ids[p]})" if p in self.child_ids
                 else f"`{p[:8]}`" for p in candidate.parents]
        tags[view.NOTE_TAG] = (f"`{candidate.id}` {candidate.operator}, gen {generation}, {result.status.value}"
                               + (f"; parents {', '.join(links)}" if links else "") + "; the parent run's "
                               f"`{view.TABLE}` holds its gene diff against its parent")
        run_id = self.client.create_run(self.experiment_id, run_name=f"cand-{candidate.id[:8]}",
                                        tags=tags_of(tags)).info.run_id
        self.child_ids[candidate.id] = run_id
        try:
            params = {f"gene.{name}": str(value) for name, value in candidate.genome.genes}
            params["patch"] = ",".join(name for name, _ in candidate.genome.patch) or "none"
            values = candidate_metrics(generation, result, self.run.evaluator.kind == "replay")
            values |= {f"llm.{k}": usage[k] for k in LLM_FIGURES if usage and usage[k]}
            self._log_batch(run_id, metrics_of(values, 0), params_of(params))
            for name, text in self._candidate_files(candidate, result):
                self.client.log_text(run_id, text, name)
        except Exception:
            # The run stays findable and says its record is incomplete; kf.status still carries the outcome.
            self.client.set_terminated(run_id, status="FAILED")
            raise
        self.client.set_terminated(run_id, status="FINISHED")

    def _candidate_files(self, candidate: Candidate, result: EvalResult) -> Iterator[tuple[str, str]]:
        # An operator-known failure's patch holds text that is not code (an edit that did not apply): no kernel.
        # .cu.txt and .log: names the artifact viewer previews (it shows no .cu).
        for dtype in (result.build or self.dtypes) if candidate.failure is None else ():
            yield f"kernel-{dtype}.cu.txt", render.render(self.problem, candidate, dtype)
            if dtype in result.build and result.build[dtype].log:
                yield f"ptxas-{dtype}.log", result.build[dtype].log
        if result.message:
            yield "message.txt", result.message
        yield from candidate.notes.items()   # e.g. an LLM operator's llm/prompt.md, llm/reply.md, llm/diff.patch

    def _log_generation(self, stats: GenerationStats, llm: Mapping[str, float]) -> None:
        if stats.generation <= self.last_generation:
            return
        # this_gen.<status>: how many of this generation's new candidates ended so (not a running total).
        counts = {status.value: 0 for status in Status} | dict(stats.counts)
        values = {"best_fitness": stats.best_fitness, "median_fitness": stats.median_fitness,
                  "evaluations": stats.evaluations, "wall_s": stats.wall_s}
        values.update({f"this_gen.{status}": n for status, n in counts.items()})
        values.update({f"op_prob.{name}": p for name, p in stats.operator_probs.items()})
        values["lessons"] = stats.lessons
        values.update(llm)
        self._log_batch(self.parent_id, metrics_of(self._once_nonzero(values), stats.generation))

    def _once_nonzero(self, values: Mapping[str, float]) -> dict[str, float]:
        """A metric is logged from its first non-zero value on: one that stays zero is not logged at all, and
        one that was ever non-zero gets every later point (zeros included), so its curve has no gaps."""
        self.nonzero |= {k for k, v in values.items() if v}
        return {k: v for k, v in values.items() if k in self.nonzero}

    def _log_table(self, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        """This generation's new candidates added to the parent's candidates.json."""
        new = [(c, r) for c, r in results if c.id not in self.tabled]
        if not new:
            return
        graph = lineage.build(results, self.run.run_id)
        copy = float(self.run.evaluator.fingerprint.get("copy_gbps", 0) or 0)
        rows = view.candidate_table(new, graph, copy, [c.key for c in self.run.cases],
                                    self.run.evaluator.kind == "replay")
        before = len(next(iter(self.table.values()), []))
        # A resumed run's table, written by an older version, may lack a column or hold another: empty cells there.
        for name in [*self.table, *(k for k in rows if k not in self.table)]:
            self.table.setdefault(name, [""] * before).extend(rows.get(name, [""] * len(new)))
        log_table_file(self.client, self.parent_id, view.table_file(self.table), view.TABLE)
        self.tabled |= {c.id for c, _ in new}

    def _log_lineage(self, results: Sequence[tuple[Candidate, EvalResult]], best_id: str | None) -> None:
        if not results:
            return
        graph = self._graph(results, best_id)
        with tempfile.TemporaryDirectory(prefix="kf-lineage-") as tmp:
            paths = lineage_image.render(graph, tmp)
            self.client.log_artifacts(self.parent_id, tmp, "lineage")
            # Also as an image with a step, so that MLflow's image grid can set runs' lineages side by side.
            from PIL import Image
            with Image.open(paths["png"]) as image:
                self.client.log_image(self.parent_id, image.convert("RGB"), key="lineage",
                                      step=max((c.generation for c, _ in results), default=0))
        self.client.log_text(self.parent_id, view.lineage_md(graph, self.run.run_id), "lineage.md")

    def _finish(self, summary: RunSummary, llm: Mapping[str, float]) -> None:
        best, replay = summary.best, self.run.evaluator.kind == "replay"
        failures = dict(Counter(r.status.value for _, r in self.seen if r.status.failed))
        recorded = "recorded_" if replay else ""   # a replay's GPU time was spent when the recording was made
        # Rounded as the run's name and description show them: the runs table's 100-pixel columns cut the rest.
        values = {"evaluations_total": summary.evaluations, "failures_total": sum(failures.values()),
                  "wall_s_total": round(summary.wall_s, 3), f"{recorded}gpu_s_total": round(summary.gpu_s, 3),
                  f"{recorded}timed_per_gpu_minute": summary.timed_per_gpu_minute, **llm}
        if best and best[1].status is Status.OK:   # no measured candidate: no best fitness (not a 0)
            values["final_best_fitness"] = round(best[1].fitness, 4)
        values = {k: v for k, v in values.items() if v or k == "failures_total"}
        values |= {f"finalist_speedup.{f['candidate_id']}": f["speedup"] for f in summary.finalists if "speedup" in f}
        values |= accounting_metrics(summary.accounting, [r for _, r in self.seen], replay)
        tags = {"kf.stop_reason": summary.stop_reason, "kf.best_candidate_id": best[0].id if best else "none"}
        graph = self._graph(self.seen, best[0].id if best else None)
        tags[view.NOTE_TAG] = self._description(graph, failures)
        self._log_batch(self.parent_id, metrics_of(values, summary.generations),
                        tags=[RunTag(k, v) for k, v in tags_of(tags).items()])
        warm = len(set(self.run.warm_start_from.values()))
        self.client.update_run(self.parent_id, name=view.run_name(self.run.seed, warm, self.run.run_id,
                                                                  best[1].fitness if best else None))
        self.client.log_text(self.parent_id, json.dumps(summary_record(summary, self.run.evaluator), indent=2),
                             "summary.json")
        self.client.log_text(self.parent_id, view.failures_md(self.seen), "failures.md")
        self._log_best_kernels(graph)
        if summary.lessons:
            self.client.log_text(self.parent_id, summary.lessons, "lessons.md")
        if self.monitor is not None:
            self.monitor.finish()
        # KILLED: stopped by Ctrl-C or SIGTERM, FAILED: by an error (a full disk), each with what it measured logged;
        # `kernel-factory resume` continues either.
        status = {"interrupted": "KILLED", "error": "FAILED"}.get(summary.stop_reason, "FINISHED")
        self.client.set_terminated(self.parent_id, status=status)

    def _graph(self, results: Sequence[tuple[Candidate, EvalResult]], best_id: str | None) -> Any:
        """This run's lineage, each warm-start seed linked to the run and candidate that bred it."""
        graph = lineage.build(results, self.run.run_id, best_id, self.run.evaluator.replay_note())
        return lineage.mark_seeds(graph, self.run.warm_start_from, self.run.warm_start_origin)

    def _log_best_kernels(self, graph: Any) -> None:
        """The source and ptxas report of the best candidate and its ancestors, under kernels/ on the parent."""
        found = {c.id: (c, r) for c, r in self.seen}
        for node in lineage.best_ancestry(graph):
            if node in found:
                cand, res = found[node]
                for name, text in self._candidate_files(cand, res):
                    if name.startswith(("kernel-", "ptxas-")):
                        self.client.log_text(self.parent_id, text, f"kernels/{node}/{name}")
