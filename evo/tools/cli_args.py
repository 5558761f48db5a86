"""The `kernel-factory` command line: its subcommands, their arguments and help (cli.py runs them)."""
from __future__ import annotations

import argparse

WITHOUT_HELP = ("leave these declared peers out (comma list, e.g. quack,quack_tuned); every headline then says "
                "so. Without it, a peer that cannot load stops the command before anything is timed (exit 2)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-factory", description="Evolve CUDA C++ kernels with inline PTX.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an evolutionary search from a YAML config")
    run.add_argument("config")
    run.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. -o search.population=8 (repeatable)")
    run.add_argument("--run-id", help="name the run (default: <problem>-<UTC time>-<random>)")
    res = sub.add_parser("resume", help="continue a killed run from its journal")
    res.add_argument("run_id")
    res.add_argument("--runs", default="runs", help="the runs folder (the config's out_dir)")
    rec = sub.add_parser("record", help="measure a problem's whole gene space on this GPU, for replay")
    rec.add_argument("config")
    rec.add_argument("--out", help="output .jsonl.gz (default: runs/recordings/<problem>-<dtype>.jsonl.gz)")
    rec.add_argument("--sample", type=int, help="record a uniform random sample of this many genomes")
    rec.add_argument("--sample-seed", type=int, default=0)
    rec.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    rec.add_argument("--cpu-failures", metavar="RECORDING",
                     help="no GPU: add to RECORDING the genomes outside the problem's rule that fail to compile "
                          "(NVRTC on the CPU), with their logs; written to --out (default: RECORDING itself)")
    rec.add_argument("--outside-rule", metavar="RECORDING",
                     help="on a GPU: evaluate the genomes of RECORDING's space that the problem's rule rejects and "
                          "add those that fail, with the gate's status and log; written to --out (default: "
                          "RECORDING itself)")
    sub.add_parser("problems", help="list the installed problem plugins")
    new = sub.add_parser("new", help="scaffold a problem plugin package (kf_NAME/) that passes `check` as written")
    new.add_argument("name", help="the problem's name: lower-case letters, digits and _")
    new.add_argument("--dir", default=".", help="the folder to write kf_NAME/ into (default: here)")
    chk = sub.add_parser("check", help="check a problem plugin against every rule of docs/adding-a-problem.md "
                                       "without a GPU: contract, CPU reference, inputs, baselines and launches, "
                                       "NVRTC compiles of its genomes with ptxas resources")
    chk.add_argument("problem")
    chk.add_argument("--sample", type=int, default=16, help="genomes to compile (default 16, defaults included)")
    chk.add_argument("--all", action="store_true", help="compile every feasible genome")
    chk.add_argument("--seed", type=int, default=0, help="which sample")
    chk.add_argument("--shapes", type=int, default=3, help="correctness shapes run on the CPU per dtype (default 3)")
    chk.add_argument("--jobs", type=int, help="compile processes (default: the CPU cores, at most 8)")
    lin = sub.add_parser("lineage", help="how a run's best (or a given) candidate came about, step by step")
    lin.add_argument("run_id", help="a run id (its folder under --runs) or the MLflow run id of its parent run")
    lin.add_argument("candidate", nargs="?", help="a candidate id or a unique prefix (default: the run's best)")
    lin.add_argument("--out", help="also draw the run's lineage: FILE.png, .svg, .html or .json writes that file; "
                                 "a folder (existing, ending in /, or without a suffix) gets all four")
    lin.add_argument("--runs", default="runs", help="the runs folder (the config's out_dir)")
    lin.add_argument("--store", default="runs/mlflow.db", help="the MLflow store, to look up an MLflow run id")
    exp = sub.add_parser("export", help="write a dispatch table (best genome per dtype and N) from runs' results")
    exp.add_argument("sources", nargs="+", metavar="RUN",
                     help="a run id under --runs, a run folder, a journal.jsonl or a recording .jsonl.gz")
    exp.add_argument("--problem", required=True)
    exp.add_argument("--out", help="the table to write (default: kernels/ops/<problem>.json)")
    exp.add_argument("--build", action="store_true", help="also compile sm_90a cubins next to it (cubins/)")
    exp.add_argument("--runs", default="runs", help="the runs folder (the config's out_dir)")
    gra = sub.add_parser("graft", help="graft a rule learned for a region of shapes (M <= 64, say) into a dispatch "
                                       "table, and build the kernels it adds")
    gra.add_argument("graft", metavar="GRAFT.json", help="the region, a rule per dtype and the genes of its genomes "
                                                        "(tests/gpu/small_m_study.py writes one); .json or .json.xz")
    gra.add_argument("--problem", required=True)
    gra.add_argument("--table", help="the table to graft onto (default: kernels/ops/<problem>.json)")
    gra.add_argument("--dtypes", metavar="DTYPE,...", help="graft only these dtypes' rules (default: every one given)")
    gra.add_argument("--out", help="the table to write (default: the --table itself)")
    wid = sub.add_parser("widen", help="add a workload campaign's panel winners to a dispatch table as candidates "
                                       "for the op's first-call tuning, and build their kernels")
    wid.add_argument("campaign", help="the campaign folder (panel-<dtype>.jsonl or panels.tar.xz)")
    wid.add_argument("--problem", required=True)
    wid.add_argument("--table", help="the table to widen (default: kernels/ops/<problem>.json)")
    wid.add_argument("--out", help="the table to write (default: the --table itself)")
    wid.add_argument("--where", metavar="FEATURE<=VALUE",
                     help="time the added candidates only on calls inside this region (e.g. log2_n<=8: rows of at "
                          "most 256 elements; log2_n>=14: of at least 16384), as a study of those shapes measured "
                          "them")
    twi = sub.add_parser("twin", help="replace every genome of a dispatch table by its twin with some genes set (where "
                                      "feasible), and build the kernels")
    twi.add_argument("--problem", required=True)
    twi.add_argument("--set", action="append", required=True, metavar="GENE=VALUE",
                     help="a gene value of every twin (repeatable), e.g. tail=peel")
    twi.add_argument("--table", help="the table to twin (default: kernels/ops/<problem>.json)")
    twi.add_argument("--out", help="the table to write (default: the --table itself)")
    twi.add_argument("--keep", action="store_true",
                     help="keep each replaced genome as a tuning candidate, so that first-call tuning can still pick "
                          "it where it is faster than its twin")
    hel = sub.add_parser("heldout", help="bench a workload campaign's learned dispatch on its held-out shapes")
    hel.add_argument("campaign", help="the campaign folder (holds workload.json)")
    hel.add_argument("--from", dest="from_json", metavar="BENCH.json", help="re-render a recorded held-out bench")
    hel.add_argument("--without", metavar="PEER,...", help=WITHOUT_HELP)
    hel.add_argument("--out", metavar="DIR", help="with --from: also write the re-rendered heldout.md here")
    hel.add_argument("--against", metavar="FOLDER",
                     help="with --from: compare with an earlier held-out bench of the same shapes (its folder): each "
                          "row's ratio to the best peer then and now, and each provider's time apart by its host "
                          "path (written as compared-FOLDER.md with --out)")
    hel.add_argument("--go-on", action="store_true",
                     help="time only the cases the folder's held-out bench (cut short) lacks; its rows stay")
    ben = sub.add_parser("bench", help="time a kernel against every baseline side by side (table, CSV, JSON, PNG)")
    ben.add_argument("--problem", help="the problem (default: rmsnorm_fwd)")
    ben.add_argument("--suite", help="a bench suite YAML: several benches in one command and one report "
                                     "(e.g. configs/bench/rmsnorm-h200.yaml)")
    what = ben.add_argument_group("subject (exactly one, unless --suite)")
    what.add_argument("--genes", help="a genome as JSON (missing genes take their defaults)")
    what.add_argument("--run", help="a run id (or journal path): its best candidate")
    what.add_argument("--table", help="a dispatch table from `kernel-factory export`")
    what.add_argument("--op", action="store_true", help="the exported library op")
    ben.add_argument("--shapes", help="benchmark (default), heldout, correctness or MxN,MxN")
    ben.add_argument("--dtypes", help="comma list, e.g. bfloat16,float16 (default: bfloat16)")
    ben.add_argument("--baselines", help="comma list (default: every peer the problem declares for the shapes)")
    ben.add_argument("--without", metavar="PEER,...", help=WITHOUT_HELP)
    ben.add_argument("--reps", type=int, help="samples per provider per row (default 50; a suite's file sets its own)")
    ben.add_argument("--repeat", type=int, help="time the subject this many passes, a spread check (default 1)")
    ben.add_argument("--graph-below-us", type=float,
                     help="time launches shorter than this as CUDA-graph replays (default 30; 0: never)")
    ben.add_argument("--out", help="folder for bench.{json,csv,md,png}")
    ben.add_argument("--stem", default="bench", help="file name stem in --out")
    ben.add_argument("--compare", metavar="JSON", nargs="+",
                     help="earlier bench or suite JSONs (several are joined): each row's ratio to the best peer "
                          "before and now, regressions first")
    ben.add_argument("--regression-pct", type=float, default=2.0,
                     help="a fall in a row's ratio to the best peer larger than this (%%) is a regression")
    ben.add_argument("--report-only", action="store_true",
                     help="exit 0 even when --compare finds a regression (default: exit 1)")
    ben.add_argument("--from", dest="from_json", nargs="+", metavar="JSON",
                     help="re-render a recorded bench or suite JSON, or join several bench JSONs into one suite "
                          "report (no GPU needed)")
    gap = sub.add_parser("gap", help="the targets against committed benches and run journals, and why (no GPU)")
    gap.add_argument("targets", help="a targets YAML (e.g. configs/targets/rmsnorm-h200.yaml)")
    gap.add_argument("--out", help="folder for gap.md and gap.json")
    gap.add_argument("--stem", default="gap", help="file name stem in --out")
    gap.add_argument("--report-only", action="store_true",
                     help="exit 0 even when a target is missed (default: exit 1)")
    gap.add_argument("--without", metavar="PEER,...",
                     help="compute 'vs best peer' from benches that lack these peers (every report says so)")
    rep = sub.add_parser("report", help="write the results page from the committed raw results (no GPU)")
    rep.add_argument("--out", default="docs/results.md", help="the page to write (default docs/results.md)")
    rep.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs from the page, "
                     "if a committed report no longer renders from its raw file, or if a number on README.md or "
                     "docs/*.md does not stand on the raw line it cites")
    flt = sub.add_parser("faults", help="run the evaluator's fault suite on this GPU and print its table")
    flt.add_argument("--out", help="also write the table as JSON here")
    gen = sub.add_parser("genes", help="write each template's genes header (gene macros and defaults) from its "
                                       "problem's gene space; --check only verifies")
    gen.add_argument("problems", nargs="*", help="problem names (default: every installed problem)")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 if a header is stale or missing")
    gen.add_argument("--dir", help="the folder of the templates (e.g. a plugin's source folder, when the plugin is "
                                   "installed as a copy); default: kernels/ and each problem module's folder")
    ui = sub.add_parser("ui", help="serve the MLflow UI over the run store (on 127.0.0.1 unless --host)")
    ui.add_argument("--store", default="runs/mlflow.db")
    ui.add_argument("--artifacts", default="runs/artifacts")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 shares it)")
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ptx-kernel-factory")
    except PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown (not installed)"
