"""`kernel-factory bench`: time a subject against its peers (or a suite of benches), write the JSON after every
case so that a bench stopped by Ctrl-C or SIGTERM keeps what it measured, compare with earlier results, and render
the report. A peer asked for that ran on no row is an error (exit 2) once the report is written, unless the command
left it out (`--without`). `--from` re-renders recorded results without timing anything."""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time

from ..config import ConfigError
from . import bench, bench_report, bench_suite, peers
from .exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, interrupt_code


def main(args: argparse.Namespace) -> int:
    """Time (or re-render with --from) and report; compare with earlier results; exit 1 on a regression."""
    stopped = EXIT_INTERRUPTED
    if args.from_json:
        result = recorded_bench(args.from_json)
    else:
        so_far: list[dict] = []

        started = time.monotonic()

        def keep(partial: dict) -> None:   # the JSON after every case: even a killed bench leaves its rows
            so_far[:] = [partial]
            bench_progress(partial, time.monotonic() - started)
            if args.out:
                bench_report.write_json(partial, args.out, args.stem)
        try:
            if args.suite:
                subjects = [f for f in ("genes", "run", "table", "op", "problem", "dtypes", "shapes", "baselines")
                            if getattr(args, f)]
                if subjects:
                    raise ConfigError(f"--suite takes every part's settings from its file; drop --{subjects[0]}")
                result = bench_suite.run(bench_suite.load(args.suite, peers.split_names(args.without),
                                                          reps=args.reps, repeat=args.repeat,
                                                          graph_below_us=args.graph_below_us),
                                         args.suite, on_update=keep)
            else:
                if (args.reps or 50) < 1 or (args.repeat or 1) < 1:
                    raise ConfigError("--reps and --repeat must be >= 1")
                subject = {"genes": args.genes, "run": args.run, "table": args.table, "op": "op" if args.op else None}
                result = bench.run(args.problem or "rmsnorm_fwd", subject, args.shapes or "benchmark",
                                   [d for d in (args.dtypes or "bfloat16").split(",") if d],
                                   [b for b in args.baselines.split(",") if b] if args.baselines is not None else None,
                                   args.reps or 50, args.repeat or 1,
                                   30.0 if args.graph_below_us is None else args.graph_below_us, on_row=keep,
                                   without=peers.split_names(args.without))
        except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM (main): report what was measured
            stopped = interrupt_code(exc)
            if not so_far:
                print("kernel-factory: bench interrupted before its first case was measured; nothing written",
                      file=sys.stderr)
                return stopped
            result = so_far[0]
    if args.compare:
        from . import bench_compare
        before = [bench_suite.read(name) for name in args.compare]
        previous = before[0] if len(before) == 1 else {"parts": [p for b in before for p in bench_compare.parts(b)]}
        result["compared"] = bench_compare.compare(result, previous, ", ".join(args.compare), args.regression_pct)
    render = bench_suite if result.get("format") == bench_suite.FORMAT else bench_report
    print(render.markdown(result))
    if args.out:
        paths = render.write(result, args.out, args.stem)
        print(f"written: {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    if result.get("partial") and not args.from_json:
        print(f"kernel-factory: bench interrupted; the report covers what was measured ({result['partial']})",
              file=sys.stderr)
        return stopped
    missing = [m for part in result.get("parts", [result]) for m in peers.not_run(part)]
    if missing and not args.from_json:
        print(not_run_line(missing), file=sys.stderr)
        return EXIT_BAD_INPUT
    regressions = result.get("compared", {}).get("counts", {}).get("regression", 0)
    if regressions and not args.report_only:
        print(f"kernel-factory: {regressions} row(s) regressed by more than {args.regression_pct:g}% against "
              f"{', '.join(args.compare)} (exit {EXIT_FAILED}; --report-only exits 0)", file=sys.stderr)
        return EXIT_FAILED
    return 0


def not_run_line(missing: list[tuple[str, str, str]]) -> str:
    """One line for the peers that ran on no row: which, where, why, and the flag that accepts it."""
    names = list(dict.fromkeys(n for n, _, _ in missing))
    where = "; ".join(f"{n} on {d}: {why.removeprefix('ran on no row: ')[:120]}" for n, d, why in missing)
    return (f"kernel-factory: error: {'peers' if len(names) > 1 else 'peer'} {', '.join(names)} ran on no row "
            f"({where}); the report is written and says so; rerun with the peer fixed, or say it is left out "
            f"with --without {','.join(names)} (exit {EXIT_BAD_INPUT})")


def bench_progress(partial: dict, elapsed_s: float) -> None:
    """One progress line (rate, ETA) per measured case of a bench, to stderr through logging."""
    from ..observers.console import progress
    done = len(partial.get("rows", [])) or sum(len(p.get("rows", [])) for p in partial.get("parts", []))
    counted = re.match(r"(\d+) of (\d+) cases", str(partial.get("partial", "")))
    total = int(counted.group(2)) if counted else done
    logging.getLogger("kernel_factory.bench").info(progress(done, total, elapsed_s, "cases"))


def recorded_bench(files: list[str]) -> dict:
    """`--from`: one recorded bench or suite JSON, or several bench JSONs joined into a suite; nothing is timed."""
    results = []
    for name in files:
        result = bench_suite.read(name)
        for part in result.get("parts", [result]):
            print(f"(re-rendered from {name}: {part['problem']} measured on {part['fingerprint'].get('gpu', '?')} "
                  f"{part['fingerprint'].get('date', '')[:10]}; nothing was timed now)")
        results.append(result)
    if len(results) == 1:
        return results[0]
    if any(r.get("format") == bench_suite.FORMAT for r in results):
        raise ConfigError("--from joins bench results, not suites: give a suite JSON alone")
    return bench_suite.join(results, files)
