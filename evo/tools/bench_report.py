"""Render a bench result (bench.py's JSON): the table with the worst rows first, the geomean per baseline, the
repeat spread, CSV, markdown and a PNG chart, each headed by the environment fingerprint. Which peers ran, which
did not (and why) and where one crashed is said from the result itself (tools/peers.py): in the sentence naming the
best peer, and on the geomean line. Runs without a GPU, so a recorded result can be re-rendered anywhere
(`kernel-factory bench --from BENCH.json`)."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import bench_compare, peers
from .peers import COPY, SUBJECT, comparable, peer_set

FINGERPRINT_KEYS = ("gpu", "sm_count", "driver", "cuda_driver_api", "cuda_runtime", "nvrtc", "torch",
                    "pkg.triton", "pkg.quack-kernels", "pkg.liger-kernel", "pkg.nvidia-cutlass-dsl", "clocks_before",
                    "clocks_after", "copy_gbps", "date")


def ratio(row: Mapping[str, Any], baseline: str) -> float | None:
    """baseline time / subject time (above 1: the subject is faster); None if either is missing or the two times
    cannot stand against each other (peers.comparable)."""
    p = row["providers"]
    if "us" not in p.get(SUBJECT, {}) or "us" not in p.get(baseline, {}) or not comparable(p[SUBJECT], p[baseline]):
        return None
    return p[baseline]["us"] / p[SUBJECT]["us"]


def best_peer(row: Mapping[str, Any], peers: Sequence[str]) -> tuple[str, float] | None:
    """The fastest of the peers whose time can stand against ours on the row (peers.comparable)."""
    mine = row["providers"].get(SUBJECT, {})
    timed = [(n, e["us"]) for n in peers if "us" in (e := row["providers"].get(n, {}))
             and ("us" not in mine or comparable(mine, e))]
    return min(timed, key=lambda t: t[1]) if timed else None


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def repeat_spread(row: Mapping[str, Any]) -> float | None:
    """Largest relative distance (%) of the subject's repeated medians from its first median."""
    s = row["providers"].get(SUBJECT, {})
    if "us" not in s or not s.get("repeat_us"):
        return None
    return max(abs(r - s["us"]) / s["us"] * 100 for r in s["repeat_us"])


def worst_first(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    peers = peer_set(result)

    def key(row):
        best = best_peer(row, peers)
        mine = row["providers"].get(SUBJECT, {}).get("us")
        return best[1] / mine if best and mine else -1.0
    return sorted(result["rows"], key=key)


def geomeans(result: Mapping[str, Any]) -> list[tuple[str, float | None]]:
    """(label, geomean of baseline / ours over the rows where both were timed): the best peer first."""
    peers = peer_set(result)
    rows = [r for r in result["rows"] if "us" in r["providers"].get(SUBJECT, {})]
    out = [("vs best peer", geomean([best_peer(r, peers)[1] / r["providers"][SUBJECT]["us"] for r in rows
                                     if best_peer(r, peers)]))]
    return out + [(f"vs {p}", geomean([v for v in (ratio(r, p) for r in rows) if v])) for p in result["baselines"]]


def fmt(v: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def best_of_sentence(result: Mapping[str, Any]) -> str:
    """"Best peer: the fastest of ... in each row", from the published peers that ran, per dtype where they differ."""
    best_of = peer_set(result)
    ran = {d: [n for n in best_of if n in peers.account(result, d).ran] for d in peers.dtypes_of(result)}
    named = {d: ", ".join(names) or "none (no peer ran)" for d, names in ran.items()}
    if len(set(named.values())) <= 1:
        return f"Best peer: the fastest of {next(iter(named.values()), ', '.join(best_of))} in each row."
    return "Best peer, the fastest in each row of: " + "; ".join(f"{d} {n}" for d, n in named.items()) + "."


def peer_lines(result: Mapping[str, Any]) -> list[str]:
    """Per dtype, each peer that did not run everywhere and why (left out, ran on no row, crashed, failed)."""
    out = []
    for dtype in peers.dtypes_of(result):
        out += [f"- {dtype}: {line}" for line in peers.account(result, dtype).details()]
    return ["Peers that did not run on every row:", *out] if out else []


def headline_note(result: Mapping[str, Any]) -> str:
    """The note of the geomean line: what the peers that did not run everywhere change, per dtype if it differs."""
    notes = {d: peers.account(result, d).note() for d in peers.dtypes_of(result)}
    if len(set(notes.values())) <= 1:
        note = next(iter(notes.values()), "")
        return f" ({note})" if note else ""
    return " (" + "; ".join(f"{d}: {n or 'every peer'}" for d, n in notes.items()) + ")"


def quality(result: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """A time's marks beside its cell: h where part of the host path may be inside it, ~ where its samples spread."""
    return (" h" if peers.host_inside(entry, result.get("flush_us")) else "") + (" ~" if peers.noisy(entry) else "")


def quality_legend(result: Mapping[str, Any]) -> list[str]:
    """What the h and ~ marks mean, and how many times carry them, where any does."""
    entries = [p for r in result["rows"] for n, p in r["providers"].items() if n != COPY and "us" in p]
    host = sum(peers.host_inside(p, result.get("flush_us")) for p in entries)
    spread = sum(peers.noisy(p) for p in entries)
    short = [f"{r['case']}: {peers.memory_short(r)}" for r in result["rows"] if peers.memory_short(r)]
    if not host and not spread and not short:
        return []
    flush = result.get("flush_us")
    host_part = (f"h, timed eagerly with a host time per call above the L2 flush's {flush:.1f} µs (the GPU waited on "
                 f"the host inside the events: an upper bound that moves with the host's load), {host} of "
                 f"{len(entries)} times" if flush else "h, not recorded (this bench kept no host times)")
    return ["", f"Marks: {host_part}; ~, samples spread (IQR above {peers.NOISY_IQR:.0%} of the median), {spread} of "
                f"{len(entries)}.", *([f"GPU memory short while timing, on {len(short)} rows (the providers that "
                                       f"allocate per call pay for each retry):", *[f"- {s}" for s in short]]
                                     if short else [])]


def markdown(result: Mapping[str, Any]) -> str:
    baselines = result["baselines"]
    fp = result["fingerprint"]
    lines = [f"# Bench: {result['subject']} ({result['problem']})", "",
             "Environment: " + "; ".join(f"{k} {fp[k]}" for k in FINGERPRINT_KEYS if k in fp), "",
             f"Timing: CUDA events, L2 flushed before every sample, providers interleaved sample by sample, "
             f"{result['reps']} samples each, median (IQR in the JSON); launches under {result['graph_below_us']:g} "
             f"µs timed as CUDA-graph replays where capturable (marked g). Measured copy bandwidth "
             f"{result['copy_gbps']:.0f} GB/s. Ratio = baseline µs / ours (above 1: ours is faster); '-' where a "
             f"baseline timed eagerly (its host path included) was slower than ours as a graph replay: the two "
             f"cannot stand against each other. Worst rows "
             f"first (by ratio to the best peer). {best_of_sentence(result)}", ""]
    if result.get("partial"):
        lines += [f"**Partial**: the bench was stopped after {result['partial']}; only those are here.", ""]
    row_copies = any("us" in r["providers"].get(COPY, {}) for r in result["rows"])
    if row_copies:
        lines += [f"% row copy: a copy of the row's bytes, timed with the providers, over ours (its own time is in "
                  f"the JSON and CSV as provider '{COPY}'): the roofline at the row's size.", ""]
    head = ["case", "ours µs", "GB/s", "% copy", *(["% row copy"] if row_copies else []), "best peer",
            "vs best"] + [f"vs {p}" for p in baselines]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in worst_first(result):
        mine = row["providers"].get(SUBJECT, {})
        best = best_peer(row, peer_set(result))
        copy = row["providers"].get(COPY, {}).get("us")
        cells = [row["case"], fmt(mine.get("us"), ".1f") + (" g" if mine.get("graph") else "") + quality(result, mine),
                 fmt(mine.get("gbps"), ".0f"), fmt(mine.get("pct_copy"), ".0f", "%"),
                 *([fmt(100 * copy / mine["us"] if copy and "us" in mine else None, ".0f", "%")] if row_copies
                   else []),
                 f"{best[0]} {best[1]:.1f}" if best else "-",
                 fmt(best[1] / mine["us"] if best and "us" in mine else None)]
        for p in baselines:
            r = ratio(row, p)
            err = row["providers"].get(p, {}).get("error")
            mark = (" g" if row["providers"].get(p, {}).get("graph") else "") + \
                (" *" if row["providers"].get(p, {}).get("note") else "") + quality(result, row["providers"].get(p, {}))
            cells.append(fmt(r) + mark if r else "crashed" if err and peers.crashed(row["providers"][p]) else
                         ("n/a" if err and err.startswith("unavailable") else ("fails" if err else "-")))
        if "error" in mine:
            cells[1] = f"ERROR: {mine['error'][:80]}"
        if row.get("crashed"):
            cells[1] = f"CRASHED: {row['crashed'][:80]}"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Geomean of the ratios{headline_note(result)}: "
              + "; ".join(f"{label} {fmt(value)}" for label, value in geomeans(result))]
    if peer_lines(result):
        lines += ["", *peer_lines(result)]
    spreads = [(row["case"], repeat_spread(row)) for row in result["rows"]]
    spreads = [(c, s) for c, s in spreads if s is not None]
    if spreads:
        worst = max(spreads, key=lambda t: t[1])
        lines += ["", f"Repeat: the subject timed again in a separate pass differs from the first pass by at most "
                      f"{worst[1]:.2f}% per row (worst {worst[0]}; median {sorted(s for _, s in spreads)[len(spreads) // 2]:.2f}%)."]
    notes = [(row["case"], n, p["note"]) for row in result["rows"] for n, p in row["providers"].items() if "note" in p]
    if notes:
        lines += ["", "Timed, but outside the problem's tolerance (marked *):"] + \
            [f"- {c} {n}: {e[:160]}" for c, n, e in notes]
    errors = [(row["case"], n, p["error"]) for row in result["rows"] for n, p in row["providers"].items() if "error" in p]
    if errors:
        lines += ["", "Providers without a time:"] + [f"- {c} {n}: {e[:160]}" for c, n, e in errors]
    lines += quality_legend(result)
    if result.get("compared"):
        lines += bench_compare.section(result["compared"])
    return "\n".join(lines) + "\n"


def to_csv(result: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    buf.write("# " + json.dumps(result["fingerprint"], sort_keys=True) + "\n")
    w = csv.writer(buf)
    w.writerow(CSV_HEADER)
    w.writerows(csv_rows(result))
    return buf.getvalue()


CSV_HEADER = ["case", "dtype", "M", "N", "bytes", "provider", "us", "iqr_us", "gbps", "pct_copy", "graph",
              "ratio_vs_provider", "repeat_us", "error"]


def csv_rows(result: Mapping[str, Any]) -> list[list[Any]]:
    """One CSV row per row and provider (CSV_HEADER's columns)."""
    out = []
    for row in result["rows"]:
        for name, p in row["providers"].items():
            r = ratio(row, name) if name != SUBJECT else 1.0
            out.append([row["case"], row["dtype"], *row["shape"], row["bytes"], name, p.get("us", ""),
                        p.get("iqr_us", ""), p.get("gbps", ""), p.get("pct_copy", ""), p.get("graph", ""),
                        r if r is not None else "", ";".join(f"{v:.3f}" for v in p.get("repeat_us", [])),
                        p.get("error", "")])
    return out


def chart(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(result["rows"])), 4.5))
    draw(ax, result)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw(ax: Any, result: Mapping[str, Any]) -> None:
    """One bench's ratios to each baseline, a group of bars per row, on a log axis so that ratios near 1 stay
    readable beside a baseline many times slower."""
    rows, peers = result["rows"], result["baselines"]
    width = 0.8 / max(1, len(peers))
    for i, p in enumerate(peers):
        vals = [ratio(r, p) or math.nan for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], vals, width, label=p)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    several = len({r["dtype"] for r in rows}) > 1
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))],
                  [r["case"] if several else r["case"].split(":")[-1] for r in rows], rotation=45, ha="right",
                  fontsize=7 if several else 8)
    ax.set_ylabel("baseline µs / ours (>1: ours faster)")
    fp = result["fingerprint"]
    ax.set_title(f"{result['subject']} - {fp.get('gpu', '?')}, {fp.get('date', '')[:10]}, copy "
                 f"{result['copy_gbps']:.0f} GB/s", fontsize=9)
    ax.legend(fontsize=7, ncol=3)


def write_json(result: Mapping[str, Any], out_dir: str | Path, stem: str = "bench") -> Path:
    """The raw result alone (cheap: bench writes it after every case; `--from` renders the rest)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)   # a kill mid-write leaves the previous JSON whole
    return path


def write(result: Mapping[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    out = Path(out_dir)
    paths = {"json": write_json(result, out, stem), "csv": out / f"{stem}.csv", "md": out / f"{stem}.md",
             "png": out / f"{stem}.png"}
    paths["csv"].write_text(to_csv(result))
    paths["md"].write_text(markdown(result))
    chart(result, paths["png"])
    return paths
