"""A bench (or suite) result against an earlier one: per row, the ratio to the best peer before and now, and the
rows where it fell (regressions). Ratios, not raw times, are compared: each is measured side by side in its own
process, so clock or host differences between the two benches cancel out of it."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .peers import SUBJECT, peer_set

# Between two H200 benches of the same backward kernels (docs/results/bench/bwd.json, and the previous table's in
# history at 6e20ce6: runs/evidence/h200-2026-12-01/bench/call5-bwd-previous-table.json), rows from 1024 up moved
# by at most 1.4%. Small rows move more, and their IQRs say so: the bar for a row is the larger of this and the
# spread of both benches there.
DEFAULT_PCT = 2.0


def parts(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(result["parts"]) if "parts" in result else [result]


def timed_rows(result: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Mapping[str, Any]]]:
    """(problem, case) -> {ours and each published peer timed there: its provider entry}, where ours was timed."""
    out = {}
    for part in parts(result):
        peers = peer_set(part)
        for row in part["rows"]:
            timed = {n: p for n, p in row["providers"].items() if "us" in p and (n == SUBJECT or n in peers)}
            if SUBJECT in timed:
                out[(part["problem"], row["case"])] = timed
    return out


def ratio(timed: Mapping[str, Mapping[str, Any]], peers: set[str]) -> tuple[float, float]:
    """(best of these peers' µs / ours, the ratio's relative spread: ours' and that peer's IQR / median, summed)."""
    best = min(peers, key=lambda n: timed[n]["us"])
    mine, peer = timed[SUBJECT], timed[best]
    return peer["us"] / mine["us"], mine.get("iqr_us", 0.0) / mine["us"] + peer.get("iqr_us", 0.0) / peer["us"]


def compare(result: Mapping[str, Any], previous: Mapping[str, Any], source: str,
            threshold_pct: float = DEFAULT_PCT) -> dict[str, Any]:
    now, before = timed_rows(result), timed_rows(previous)
    rows = []
    for key in sorted(now.keys() & before.keys()):
        peers = (now[key].keys() & before[key].keys()) - {SUBJECT}   # the same bar on both sides
        if not peers:
            continue
        (r_now, s_now), (r_before, s_before) = ratio(now[key], peers), ratio(before[key], peers)
        us_now, us_before = now[key][SUBJECT]["us"], before[key][SUBJECT]["us"]
        change = 100 * (r_now / r_before - 1)
        bar = max(threshold_pct, 100 * (s_now + s_before))
        verdict = "regression" if change < -bar else "improvement" if change > bar else "same"
        rows.append({"problem": key[0], "case": key[1], "before": round(r_before, 4), "now": round(r_now, 4),
                     "peers": sorted(peers), "change_pct": round(change, 2), "bar_pct": round(bar, 2),
                     "ours_us_before": round(us_before, 3),
                     "ours_us_now": round(us_now, 3), "verdict": verdict})
    rows.sort(key=lambda r: r["change_pct"])
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("regression", "improvement", "same")}
    return {"with": source, "threshold_pct": threshold_pct, "counts": counts, "rows": rows,
            "only_now": len(now.keys() - before.keys()), "only_before": len(before.keys() - now.keys()),
            "no_common_peer": len(now.keys() & before.keys()) - len(rows), "host_paths": host_paths(result, previous)}


def eager_times(result: Mapping[str, Any]) -> dict[tuple[str, str, str], tuple[float, bool]]:
    """(problem, case, provider) -> (µs, whether its host path per call outlasted that bench's L2 flush), for every
    provider timed eagerly (graph replays have no host path in their events)."""
    out = {}
    for part in parts(result):
        flush = part.get("flush_us") or 0.0
        for row in part["rows"]:
            for name, p in row["providers"].items():
                if "us" in p and not p.get("graph") and flush > 0:
                    out[(part["problem"], row["case"], name)] = (p["us"], p.get("host_us", 0.0) > flush)
    return out


def host_paths(result: Mapping[str, Any], previous: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per provider, its time now over before on the rows both benches timed eagerly, apart where the earlier
    host path outlasted the earlier flush ("slow") and where it did not ("fast"): a provider whose slow rows moved
    while its fast ones held had its host path inside one bench's events (the timer's hold, 2026-12-08, is the
    change this was made to see)."""
    now, before = eager_times(result), eager_times(previous)
    logs: dict[str, dict[str, list[float]]] = {}
    for key in now.keys() & before.keys():
        (us_now, _), (us_before, slow) = now[key], before[key]
        side = logs.setdefault(key[2], {"slow": [], "fast": []})["slow" if slow else "fast"]
        side.append(math.log(us_now / us_before))
    return [{"provider": name, "slow": _geomean(v["slow"]), "slow_rows": len(v["slow"]),
             "fast": _geomean(v["fast"]), "fast_rows": len(v["fast"])} for name, v in sorted(logs.items())]


def _geomean(logs: list[float]) -> float | None:
    return round(math.exp(sum(logs) / len(logs)), 4) if logs else None


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def section(cmp: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the comparison, largest falls first."""
    c, pct = cmp["counts"], cmp["threshold_pct"]
    lines = ["", f"## Against {cmp['with']}", "",
             f"Ratio to the best peer before and now, each side by side in its own bench, the best taken among the "
             f"published peers timed in both. A fall larger than the "
             f"row's bar is a regression: the bar is {pct:g}%, or the spread of both benches there (ours' and the "
             f"peer's IQR / median, summed) where that is wider. {_n(len(cmp['rows']), 'row')} in both: "
             f"**{_n(c['regression'], 'regression')}**, {_n(c['improvement'], 'improvement')}, {c['same']} within "
             "their bar" + (f"; {_n(cmp['only_now'], 'row')} only now, {cmp['only_before']} only before."
                            if cmp["only_now"] or cmp["only_before"] else "."), "",
             "| problem | case | before | now | change | bar | ours µs before → now | |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cmp["rows"]:
        mark = {"regression": "**regression**", "improvement": "improvement", "same": ""}[r["verdict"]]
        lines.append(f"| {r['problem']} | {r['case']} | {r['before']:.3f} | {r['now']:.3f} | {r['change_pct']:+.1f}% | "
                     f"±{r['bar_pct']:.1f}% | {r['ours_us_before']:.1f} → {r['ours_us_now']:.1f} | {mark} |")
    if cmp.get("host_paths"):
        lines += ["", "Each provider's time now over before (geomean) on the rows both benches timed eagerly: where "
                  "its host path per call outlasted the earlier bench's L2 flush, and where it did not. Slow rows "
                  "that moved while fast ones held: that host path was inside one bench's events.", "",
                  "| provider | host path past the flush | rows | within the flush | rows |", "|---|---|---|---|---|"]
        def cell(g: float | None) -> str:
            return "-" if g is None else f"{g:.3f}"
        for h in cmp["host_paths"]:
            lines.append(f"| {h['provider']} | {cell(h['slow'])} | {h['slow_rows']} | {cell(h['fast'])} | "
                         f"{h['fast_rows']} |")
    return lines
