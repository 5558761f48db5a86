"""The `kernel-factory` command: run, resume, record, problems, new, check, lineage, export, graft, widen, bench, gap, report,
faults, genes, ui. Bad input ends in one line naming the problem and a non-zero exit, never a traceback; what a run
measured before an error or Ctrl-C stays in its journal and MLflow, and a bench stopped by Ctrl-C or SIGTERM writes
its report of the cases it measured."""
from __future__ import annotations

import argparse
import json
import logging
import lzma
import os
import sys
from pathlib import Path
from typing import Any

from .. import config as config_mod
from .. import registry, yamltext
from ..config import ConfigError
from .cli_args import parser
from .exits import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_FAILED, interrupt_code, sigterm_as_interrupt

def cmd_problems() -> int:
    for name in registry.available("problem"):
        try:
            prob = registry.load("problem", name)
            print(f"{name:16s} v{prob.version}  {len(list(prob.space.genes))} genes, dtypes "
                  f"{'/'.join(prob.dtypes)}, {len(prob.shape_sets['benchmark'])} benchmark shapes  "
                  f"{prob.description}")
        except registry.PluginError as exc:
            print(f"{name:16s} BROKEN: {exc}")
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from .scaffold import next_steps, scaffold
    print(next_steps(scaffold(args.name, args.dir), args.name))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import CheckFailed, check
    if args.sample < 1 or args.shapes < 1 or (args.jobs is not None and args.jobs < 1):
        raise ConfigError("--sample, --shapes and --jobs must be >= 1")
    try:   # each line of the report once, on stdout, as it is found; the failure (and where) on stderr
        check(args.problem, None if args.all else args.sample, args.seed, args.shapes,
              emit=lambda line: print(line, flush=True), workers=args.jobs)
    except CheckFailed as exc:
        print(f"kernel-factory check: {args.problem}: FAILED {exc}", file=sys.stderr)
        if exc.context:
            print(exc.context, file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.problem}: ok")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..run import execute
    cfg = config_mod.load(args.config, tuple(args.override))
    if cfg.workload is not None:
        from .workload import run_campaign
        print(f"campaign -> {run_campaign(cfg, args.run_id)}")
        return 0
    summary = execute(cfg, args.run_id)
    return 0 if summary.best is not None else 1


def cmd_heldout(args: argparse.Namespace) -> int:
    from .heldout import main_heldout
    from .peers import split_names
    return main_heldout(args.campaign, args.from_json, split_names(args.without), args.out, args.go_on,
                        args.against)


def cmd_resume(args: argparse.Namespace) -> int:
    from ..run import Finished, resume
    try:
        summary = resume(args.run_id, args.runs)
    except Finished as done:   # the run's state is what was asked for: one line, exit 0 (docs/edges.md)
        print(f"kernel-factory: {done}")
        return 0
    return 0 if summary.best is not None else 1


def cmd_record(args: argparse.Namespace) -> int:
    from .record import record
    cfg = config_mod.load(args.config, tuple(args.override))
    if args.cpu_failures:
        from .record_cpu import add_cpu_failures
        if not Path(args.cpu_failures).is_file():
            raise ConfigError(f"--cpu-failures: no recording at {args.cpu_failures!r}")
        try:
            add_cpu_failures(registry.load("problem", cfg.problem), args.cpu_failures,
                             args.out or args.cpu_failures, Path(cfg.out_dir) / "cache")
        except ValueError as exc:
            raise ConfigError(f"--cpu-failures: {exc}") from exc
        return 0
    if args.outside_rule:
        from .record_gpu import add_gpu_failures
        if not Path(args.outside_rule).is_file():
            raise ConfigError(f"--outside-rule: no recording at {args.outside_rule!r}")
        add_gpu_failures(cfg, args.outside_rule, args.out or args.outside_rule)
        return 0
    dtypes = "-".join(cfg.dtypes or ("default",))
    out = Path(args.out or f"{cfg.out_dir}/recordings/{cfg.problem}-{dtypes}.jsonl.gz")
    path = record(cfg, out, args.sample, args.sample_seed)
    print(f"recorded -> {path}")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from ..observers import lineage, lineage_image
    run_id = args.run_id
    path = Path(args.runs) / run_id / "journal.jsonl"
    if not path.is_file() and Path(args.store).is_file():
        from ..observers.mlflow_store import kf_run_id
        run_id = kf_run_id(args.store, run_id) or run_id   # an MLflow run id, as the UI shows it
        path = Path(args.runs) / run_id / "journal.jsonl"
    if not path.is_file():
        runs = sorted(p.parent.name for p in Path(args.runs).glob("*/journal.jsonl"))
        raise ConfigError(f"no run {args.run_id!r} under {args.runs}/ nor in {args.store} (each run is a folder "
                          f"there: {', '.join(runs) or 'none yet'})")
    graph = lineage.from_journal(path)
    wanted = args.candidate or lineage.best(graph) or ""
    own = [n for n, d in graph.nodes(data=True) if d["operator"] != lineage.ORIGIN]   # not an earlier run's
    found = [wanted] if wanted in own else [node for node in own if wanted and node.startswith(wanted)]
    if len(found) != 1:
        raise ConfigError(f"candidate {wanted!r} is {'ambiguous' if found else 'not'} in run {run_id!r}; "
                          f"its candidates are in {path}")
    if graph.graph.get("replay"):
        print(graph.graph["replay"])
    print(lineage.format_chain(lineage.chain(graph, found[0])))
    if args.out:
        paths = lineage_image.write(graph, args.out)
        print(f"lineage drawn -> {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from . import export
    path, table = export.export(args.problem, args.sources, args.out or f"kernels/ops/{args.problem}.json",
                                args.runs, args.build)
    print(export.summary(path, table))
    if args.build:
        from .export_op import op_line
        print(op_line(args.problem, table, path))
    return 0


def cmd_graft(args: argparse.Namespace) -> int:
    from . import dispatch, export
    problem = export.problem_plugin(args.problem)
    table_path = args.table or f"kernels/ops/{args.problem}.json"
    try:
        raw = Path(args.graft).read_bytes()
        graft_file = json.loads(lzma.decompress(raw) if args.graft.endswith(".xz") else raw)
    except (OSError, ValueError, lzma.LZMAError) as exc:
        raise ConfigError(f"cannot read graft {args.graft!r}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not isinstance(graft_file, dict):
        raise ConfigError(f"graft {args.graft!r} must be a JSON object (region, rules, genomes, source)")
    dtypes = [d for d in (args.dtypes or "").split(",") if d]
    table = dispatch.graft(dispatch.load(table_path), graft_file, dtypes, where=args.graft)
    out = Path(args.out or table_path)
    dispatch.build(problem, table, out.parent / dispatch.CUBIN_FOLDER)
    out.write_text(dispatch.dumps(table))
    print(export.summary(out, table))
    return 0


def cmd_widen(args: argparse.Namespace) -> int:
    from . import dispatch, export, workload_panels
    problem = export.problem_plugin(args.problem)
    table_path = args.table or f"kernels/ops/{args.problem}.json"
    table = dispatch.load(table_path)
    added = dispatch.widen(table, workload_panels.folder_panels(args.campaign), dispatch.parse_region(args.where))
    out = Path(args.out or table_path)
    dispatch.build(problem, table, out.parent / dispatch.CUBIN_FOLDER)
    out.write_text(dispatch.dumps(table))
    print(export.summary(out, table))
    print("tuning candidates added: " + ", ".join(f"{d} {n}" for d, n in added.items()))
    return 0


def gene_changes(space: Any, items: list[str]) -> dict[str, Any]:
    """--set GENE=VALUE items as {gene: one of its choices}; VALUE as written (True, 16) or as a config's override
    reads it (true). ConfigError names the item and what would be valid."""
    changes = {}
    for item in items:
        name, _, text = item.partition("=")
        gene = space[name] if name in space.names else None
        try:
            read = yamltext.loads(text)
        except yamltext.YamlTextError:
            read = text
        value = next((c for c in gene.choices if str(c) == text or (type(c) is type(read) and c == read)),
                     None) if gene else None
        if value is None:
            valid = f"one of {[str(c) for c in gene.choices]}" if gene else f"a gene of {', '.join(space.names)}"
            raise ConfigError(f"--set {item!r}: {name!r} must be {valid}")
        changes[name] = value
    return changes


def cmd_twin(args: argparse.Namespace) -> int:
    from . import dispatch, export
    problem = export.problem_plugin(args.problem)
    changes = gene_changes(problem.space, args.set)
    table_path = args.table or f"kernels/ops/{args.problem}.json"
    table = dispatch.load(table_path)
    renamed = dispatch.twin(table, problem, changes, keep=args.keep)
    out = Path(args.out or table_path)
    dispatch.build(problem, table, out.parent / dispatch.CUBIN_FOLDER)
    out.write_text(dispatch.dumps(table))
    print(export.summary(out, table))
    print(f"twins ({', '.join(args.set)}): {len(renamed)} genomes "
          + ("added, each original kept as a tuning candidate" if args.keep else "replaced"))
    return 0


def cmd_gap(args: argparse.Namespace) -> int:
    from . import gap
    from .peers import split_names
    analysis = gap.analyse(gap.load_targets(args.targets), split_names(args.without))
    print(gap.markdown(analysis))
    if args.out:
        print(f"written: {', '.join(str(p) for p in gap.write(analysis, args.out, args.stem))}", file=sys.stderr)
    if not analysis["met"] and not args.report_only:
        missed = sum(not r["met"] for r in analysis["reports"])
        print(f"kernel-factory: {missed} target(s) not met (exit {EXIT_FAILED}; --report-only exits 0)",
              file=sys.stderr)
        return EXIT_FAILED
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from . import report
    if not Path(report.TARGETS).is_file():   # the page's paths are the repository's
        raise ConfigError(f"no {report.TARGETS} here: run `kernel-factory report` from the repository root")
    if args.check:
        from . import claims, rerender
        same = Path(args.out).is_file() and Path(args.out).read_text() == report.page()
        print(f"{args.out} is {'up to date' if same else 'stale: run kernel-factory report'}", file=sys.stderr)
        stale = rerender.stale(skip=(report.OUT,))   # the page itself: compared above
        print("\n".join(stale) or "every report renders from its raw file", file=sys.stderr)
        problems = [p for page in ["README.md", *sorted(Path("docs").glob("*.md"))] for p in claims.check(page)]
        print("\n".join(problems) or "every number cited holds", file=sys.stderr)
        return 0 if same and not stale and not problems else 1
    print(f"written: {report.write(args.out)}", file=sys.stderr)
    return 0


def cmd_faults(args: argparse.Namespace) -> int:
    from . import faults
    return faults.main(args.out)


def cmd_genes(args: argparse.Namespace) -> int:
    from . import genes
    folder = Path(args.dir) if args.dir else None
    if folder is not None and not folder.is_dir():
        raise ConfigError(f"--dir {args.dir!r} is not a folder")
    return genes.main([registry.load("problem", n) for n in args.problems or registry.available("problem")],
                      args.check, folder)


def cmd_ui(args: argparse.Namespace) -> int:
    from .ui import check_port, serve
    check_port(args.host, args.port)   # first: a bad or taken port is the only line, with no link to it
    if not Path(args.store).is_file():
        raise ConfigError(f"no run store at {args.store!r}: run `kernel-factory run CONFIG` first, or pass --store")
    from ..observers.mlflow_store import UI_ENV, ui_command, ui_links
    argv = ui_command(args.store, args.artifacts, host=args.host, port=args.port)
    print(f"store {args.store}", file=sys.stderr)
    for name, link in ui_links(args.store, f"http://{args.host}:{args.port}"):   # the runs, ready to compare
        print(f"start here ({name}): {link}", file=sys.stderr, flush=True)
    return serve(argv, args.host, args.port, {**os.environ, **UI_ENV})


class _Stderr(logging.StreamHandler):
    """A handler on whatever sys.stderr is when a record is written (a test's capture, a redirected stream)."""

    @property
    def stream(self):   # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging() -> None:
    """Progress and logs to stderr, as plain lines; results go to stdout with print. Only our loggers are set, so
    an embedding program's own logging is left as it was."""
    ours = logging.getLogger("kernel_factory")
    if not ours.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False


# What an interrupted command kept, and how to go on: by command, a run's words for the rest.
INTERRUPTED = {
    "run": "everything measured so far is in the run's journal and MLflow (`kernel-factory resume RUN_ID` "
           "continues a run)",
    "record": "every genome measured so far is in the recording's .partial.jsonl beside --out; the same `record` "
              "command resumes it",
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging()
    from ..evaluate.compile import ToolchainError
    from ..evaluate.gpu import WorkerError
    try:
        with sigterm_as_interrupt():
            return _dispatch(args)
    except (ConfigError, registry.PluginError, ToolchainError, WorkerError) as exc:
        print(f"kernel-factory: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        if args.command != "ui":   # stopping the UI is how it ends (serve says so); there is no run to resume
            print(f"kernel-factory: interrupted; {INTERRUPTED.get(args.command, INTERRUPTED['run'])}", file=sys.stderr)
        return interrupt_code(exc)
    except BrokenPipeError:   # the reader went away (`| head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:   # a full disk or a folder that became read-only mid-command: one line, not a traceback
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"kernel-factory: error: cannot write{where}: {exc.strerror or exc}; what was measured before "
              "stays in the run's journal", file=sys.stderr)
        return EXIT_BAD_INPUT


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench_command
    return bench_command.main(args)


def _dispatch(args: argparse.Namespace) -> int:
    commands = {"problems": lambda _: cmd_problems(), "run": cmd_run, "record": cmd_record, "resume": cmd_resume,
                "lineage": cmd_lineage, "export": cmd_export, "graft": cmd_graft, "widen": cmd_widen, "bench": cmd_bench, "gap": cmd_gap,
                "twin": cmd_twin,
                "report": cmd_report, "faults": cmd_faults,
                "heldout": cmd_heldout, "genes": cmd_genes, "check": cmd_check, "new": cmd_new}
    return commands.get(args.command, cmd_ui)(args)


if __name__ == "__main__":
    sys.exit(main())
