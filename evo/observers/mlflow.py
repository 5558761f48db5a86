"""MLflow tracking of evolutionary runs (a parent run per run, a child run per candidate), written from a background
thread so that the loop never waits on SQLite. Only this module and the history reader (evo/prior.py, which also
opens the store for it) import mlflow."""
from __future__ import annotations

import functools
from collections import Counter
import json
import logging
import os
import queue
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from . import lineage, mlflow_view as view
from .provenance import git_tags
from ..config import ConfigError, RunConfig
from ..evaluate import render
from ..prior import open_store, read_table, search_all   # before mlflow: prior sets MLflow's environment defaults
from ..protocols import EvaluatorInfo, GenerationStats, Problem, RunInfo, RunSummary
from ..types import Candidate, EvalResult, Status

# MLflow reads this when it loads; a user's own setting wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")   # log_table downloads; no bar in our console

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

# A new store logs "Creating initial MLflow database tables..." at INFO from the writer thread, which would land in
# the middle of the console observer's progress line; and every failed write logs its SQL and a traceback at ERROR
# (tens of thousands of lines for a read-only store). The writer counts failures and reports them in one line.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
# The system metrics monitor says at INFO when it starts, stops and finds no GPU; only its warnings matter here.
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)

# MLflow 3.17's limits (mlflow/utils/validation.py). Longer values would be truncated with a warning per value,
# and an oversized log_batch is rejected as a whole, so we stay inside them ourselves.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_OR_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000

# The server's background job runner costs ~1 GB of memory and nothing here uses it (api-notes 3c).
UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

# Generations between lineage drawings on the parent run (lineage/), and one more at the end.
LINEAGE_EVERY = 3

# The note an LLM operator leaves on its child: agent, model, tokens, cost and latency of the call (no key in it).
LLM_USAGE_NOTE = "llm/usage.json"
LLM_FIGURES = ("prompt_tokens", "completion_tokens", "cost_usd", "latency_s")

# Metric, param and tag names may hold alphanumerics, _ - . / and space everywhere. MLflow also takes ":" except on
# Windows, but an unquoted ":" breaks a search filter (`metrics.time_us.bfloat16:32768x256 < 6` is rejected), so a
# case key "bfloat16:32768x256" becomes "bfloat16_32768x256": valid everywhere and queryable without backticks.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")


def safe_key(text: str) -> str:
    """A metric/param/tag name MLflow accepts on every platform: unsafe characters become '_'."""
    return _UNSAFE.sub("_", text)[:MAX_KEY]


def tracking_uri(tracking: Any) -> str | None:
    """The tracking URI a run writes to: the config's tracking.uri, else MLFLOW_TRACKING_URI, else None (the
    SQLite file tracking.store, through open_store)."""
    return tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def open_tracking(tracking: Any) -> tuple[MlflowClient, str]:
    """A client on the run's tracking backend (see tracking_uri)."""
    uri = tracking_uri(tracking)
    if uri is None:
        return open_store(tracking.store)
    return MlflowClient(tracking_uri=uri), uri


class TrackingError(ConfigError):
    """The tracking store cannot be written (read-only, unreachable, broken): one line, raised at the run's start."""


def ui_command(store: str | os.PathLike[str], artifacts: str | os.PathLike[str], host: str = "127.0.0.1",
               port: int = 5000) -> list[str]:
    """argv for the MLflow UI on our store; run it with UI_ENV added to the environment."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{Path(store).resolve()}",
            "--default-artifact-root", str(Path(artifacts).resolve()), "--host", host, "--port", str(port),
            "--workers", "1"]


def experiment_id(client: MlflowClient, name: str, artifacts: Path) -> str:
    """The experiment's id, creating it with its artifact root on first use (MLflow fixes the root then)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifacts.as_uri())
        except MlflowException:
            exp = client.get_experiment_by_name(name)   # another run against the same store won the race
            if exp is None:
                raise
    if exp.artifact_location != artifacts.as_uri():
        print(f"mlflow: experiment {name!r} keeps its artifact root {exp.artifact_location}; "
              f"tracking.artifacts ({artifacts}) applies only to new experiments", file=sys.stderr)
    return exp.experiment_id


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> {"search.population": "24", ...}; non-string leaves as JSON, so None reads 'null'."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


def batches(metrics: Sequence[Metric], params: Sequence[Param], tags: Sequence[RunTag]
            ) -> Iterator[tuple[list[Metric], list[Param], list[RunTag]]]:
    """Split one run's data into as few log_batch calls as MLflow's per-call limits allow (usually one)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    while metrics or params or tags:
        p, params = params[:MAX_PARAMS_OR_TAGS_PER_BATCH], params[MAX_PARAMS_OR_TAGS_PER_BATCH:]
        t, tags = tags[:MAX_PARAMS_OR_TAGS_PER_BATCH], tags[MAX_PARAMS_OR_TAGS_PER_BATCH:]
        room = min(MAX_METRICS_PER_BATCH, MAX_ENTITIES_PER_BATCH - len(p) - len(t))
        m, metrics = metrics[:room], metrics[room:]
        yield m, p, t


def _params(values: Mapping[str, str]) -> list[Param]:
    return [Param(safe_key(k), v[:MAX_PARAM_VALUE]) for k, v in values.items()]


def _tags(values: Mapping[str, str]) -> dict[str, str]:
    return {safe_key(k): str(v)[:MAX_TAG_VALUE] for k, v in values.items()}


def _metrics(values: Mapping[str, float], step: int) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(safe_key(k), float(v), now, step) for k, v in values.items()]


def llm_usage(candidate: Candidate) -> dict[str, Any]:
    """The LLM call behind a candidate ({} for the others): {agent, model, prompt_tokens, ...}."""
    text = candidate.notes.get(LLM_USAGE_NOTE)
    return json.loads(text) if text else {}


def candidate_metrics(generation: int, result: EvalResult) -> dict[str, float]:
    """Everything numeric about one evaluation: fitness, per-case times and bandwidth, ptxas facts per dtype."""
    values: dict[str, float] = {"fitness": result.fitness, "generation": generation, "gpu_s": result.gpu_s}
    per_case = {"time_us": result.times_us, "iqr_us": result.iqr_us, "baseline_us": result.baseline_us,
                "gbps": result.gbps}
    for prefix, by_case in per_case.items():
        values.update({f"{prefix}.{safe_key(case)}": v for case, v in by_case.items()})
    for dtype, info in result.build.items():
        facts = {"registers": info.registers, "spill_stores": info.spill_stores, "shared_bytes": info.shared_bytes,
                 "compile_s": info.compile_s}
        values.update({f"{fact}.{safe_key(dtype)}": v for fact, v in facts.items() if v is not None})
    return values


class _Writer:
    """One thread runs queued MLflow calls in order. A failing call is counted and the first one kept; the
    calls after it still run, so one bad record never stops the rest (or the run)."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.failures = 0
        self.first_error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="kf-mlflow-writer", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def drain(self) -> None:
        self.jobs.join()

    def close(self) -> None:
        self.jobs.put(None)   # queued after every job, so they all run first
        self.thread.join()

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                job()
            except Exception as exc:   # noqa: BLE001 - recorded and reported in on_end, never fatal to the run
                self.failures += 1
                if self.first_error is None:
                    self.first_error = exc
            finally:
                self.jobs.task_done()
        self.jobs.task_done()


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
        self.writer: _Writer | None = None
        self.run: RunInfo | None = None
        # Set and used on the writer thread only.
        self.client: MlflowClient | None = None
        self.experiment_id = ""
        self.parent_id = ""
        self.seen: list[tuple[Candidate, EvalResult]] = []   # every result so far, for the lineage
        self.logged: set[str] = set()     # on resume: candidates whose child runs are complete already
        self.last_generation = -1         # on resume: the last generation whose metrics are logged
        # LLM calls' figures, this generation's and the run's (added up on the loop's thread).
        self.llm_generation = dict.fromkeys(LLM_FIGURES, 0.0)
        self.llm_run = dict.fromkeys(LLM_FIGURES, 0.0)

    def on_start(self, run: RunInfo) -> None:
        self.run = run
        self.writer = _Writer()
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
        if self._reattach():   # resume, or a re-run of a run id that died before its journal started
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
        parent = self.client.create_run(self.experiment_id, run_name=name, tags=_tags(tags))
        self.parent_id = parent.info.run_id
        self._monitor(uri)
        params = flatten(run.config) | {"seed": str(run.seed)}
        self._log_batch(self.parent_id, params=_params(params))
        self.client.log_text(self.parent_id, json.dumps(run.config, indent=2, default=str), "config.json")

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
        self.logged |= set(read_table(self.client, self.parent_id).get("candidate", []))
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
                                        tags=_tags(tags)).info.run_id
        self.child_ids[candidate.id] = run_id
        try:
            params = {f"gene.{name}": str(value) for name, value in candidate.genome.genes}
            params["patch"] = ",".join(name for name, _ in candidate.genome.patch) or "none"
            values = candidate_metrics(generation, result) | {f"llm.{k}": usage[k] for k in LLM_FIGURES if usage}
            values = {k: v for k, v in values.items() if v or k in ("fitness", "generation")}
            self._log_batch(run_id, _metrics(values, 0), _params(params))
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
        self._log_batch(self.parent_id, _metrics(self._once_nonzero(values), stats.generation))

    def _once_nonzero(self, values: Mapping[str, float]) -> dict[str, float]:
        """A metric is logged from its first non-zero value on: one that stays zero is not logged at all, and
        one that was ever non-zero gets every later point (zeros included), so its curve has no gaps."""
        self.nonzero |= {k for k, v in values.items() if v}
        return {k: v for k, v in values.items() if k in self.nonzero}

    def _log_table(self, results: Sequence[tuple[Candidate, EvalResult]]) -> None:
        """This generation's new candidates appended to the parent's candidates.json (MLflow's log_table)."""
        new = [(c, r) for c, r in results if c.id not in self.logged]
        if not new:
            return
        graph = lineage.build(results, self.run.run_id)
        copy = float(self.run.evaluator.fingerprint.get("copy_gbps", 0) or 0)
        rows = view.candidate_table(new, graph, copy, [c.key for c in self.run.cases])
        self.client.log_table(self.parent_id, rows, view.TABLE)
        self.logged |= {c.id for c, _ in new}

    def _log_lineage(self, results: Sequence[tuple[Candidate, EvalResult]], best_id: str | None) -> None:
        if not results:
            return
        graph = self._graph(results, best_id)
        with tempfile.TemporaryDirectory(prefix="kf-lineage-") as tmp:
            paths = lineage.render(graph, tmp)
            self.client.log_artifacts(self.parent_id, tmp, "lineage")
            # Also as an image with a step, so that MLflow's image grid can set runs' lineages side by side.
            from PIL import Image
            with Image.open(paths["png"]) as image:
                self.client.log_image(self.parent_id, image.convert("RGB"), key="lineage",
                                      step=max((c.generation for c, _ in results), default=0))
        self.client.log_text(self.parent_id, view.lineage_md(graph, self.run.run_id, self.run.warm_start_from),
                             "lineage.md")

    def _finish(self, summary: RunSummary, llm: Mapping[str, float]) -> None:
        best, replay = summary.best, self.run.evaluator.kind == "replay"
        failures = dict(Counter(r.status.value for _, r in self.seen if r.status.failed))
        recorded = "recorded_" if replay else ""   # a replay's GPU time was spent when the recording was made
        values = {"final_best_fitness": best[1].fitness if best else 0.0, "evaluations_total": summary.evaluations,
                  "failures_total": sum(failures.values()), "wall_s_total": summary.wall_s,
                  f"{recorded}gpu_s_total": summary.gpu_s,
                  f"{recorded}timed_per_gpu_minute": summary.timed_per_gpu_minute, **llm}
        values = {k: v for k, v in values.items() if v or k in ("final_best_fitness", "failures_total")}
        values |= {f"finalist_speedup.{f['candidate_id']}": f["speedup"] for f in summary.finalists if "speedup" in f}
        values |= accounting_metrics(summary.accounting)
        tags = {"kf.stop_reason": summary.stop_reason, "kf.best_candidate_id": best[0].id if best else "none"}
        graph = self._graph(self.seen, best[0].id if best else None)
        tags[view.NOTE_TAG] = self._description(graph, failures)
        self._log_batch(self.parent_id, _metrics(values, summary.generations),
                        tags=[RunTag(k, v) for k, v in _tags(tags).items()])
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
        # KILLED: stopped by Ctrl-C or SIGTERM, with what it measured logged; `kernel-factory resume` continues it.
        self.client.set_terminated(self.parent_id,
                                   status="KILLED" if summary.stop_reason == "interrupted" else "FINISHED")

    def _graph(self, results: Sequence[tuple[Candidate, EvalResult]], best_id: str | None) -> Any:
        """This run's lineage, with each warm-start seed's ancestry in the run that bred it."""
        graph = lineage.build(results, self.run.run_id, best_id, self.run.evaluator.replay_note())
        return lineage.with_origins(graph, self.run.warm_start_from, self.run.out_dir)

    def _log_best_kernels(self, graph: Any) -> None:
        """The source and ptxas report of the best candidate and its ancestors, under kernels/ on the parent."""
        found = {c.id: (c, r) for c, r in self.seen}
        for node in lineage.best_ancestry(graph):
            if node in found:
                cand, res = found[node]
                for name, text in self._candidate_files(cand, res):
                    if name.startswith(("kernel-", "ptxas-")):
                        self.client.log_text(self.parent_id, text, f"kernels/{node}/{name}")


def prepare_ui(client: MlflowClient, experiment_id: str, problem: str) -> None:
    """The experiment's UI tags: open in the training-runs view, the start link's saved view, a description."""
    tags = {view.KIND_TAG: view.KIND, view.VIEW_TAG: json.dumps(view.view_state()),
            view.NOTE_TAG: view.experiment_description(problem)}
    for key, value in tags.items():
        client.set_experiment_tag(experiment_id, key, value)


def ui_links(store: str | os.PathLike[str], base_url: str) -> list[tuple[str, str]]:
    """(experiment name, start link) for each experiment of the store that holds runs of the factory, after
    setting its UI tags (stores made before these tags existed get them here)."""
    client, _ = open_store(store)
    out = []
    for exp in client.search_experiments():
        parents = client.search_runs([exp.experiment_id], view.PARENTS_FILTER, max_results=1)
        if parents:
            prepare_ui(client, exp.experiment_id, parents[0].data.tags.get("kf.problem", exp.name))
            out.append((exp.name, view.start_link(base_url, exp.experiment_id)))
    return out


def kf_run_id(store: str | os.PathLike[str], mlflow_run_id: str) -> str | None:
    """The factory's run id of the parent run with this MLflow run id, or None (no such run, or not a parent)."""
    if not re.fullmatch(r"[0-9a-f]{32}", mlflow_run_id):
        return None
    try:
        return open_store(store)[0].get_run(mlflow_run_id).data.tags.get("kf.run_id")
    except MlflowException:
        return None


def accounting_metrics(books: Mapping[str, Any]) -> dict[str, float]:
    """The scalar part of the run's accounting (accounting.py) as metrics; the rest is in summary.json."""
    if not books:
        return {}
    out = {f"gpu_s.{safe_key(name)}": s for name, s in books["gpu_s_per_worker"].items()}
    out |= {"compile_s_host": books["compile_s_host"], "queue_depth_mean": books["queue_depth"]["mean"],
            "queue_depth_max": books["queue_depth"]["max"], "workers": books["workers"],
            "worker_respawns": books["respawns"], "llm_tokens_prompt": books["llm_tokens"]["prompt"],
            "llm_tokens_completion": books["llm_tokens"]["completion"],
            "timed_per_held_gpu_minute": books["timed_per_held_gpu_minute"]}
    return {k: float(v) for k, v in out.items()}


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
