"""The MLflow UI as a user sees it, in a real browser (Debian's chromium driven by playwright): three quickstart
runs, `kernel-factory ui`, the printed start link; the parent runs with their key columns inside the window, a run's
description, its lineage image, its candidate table sorted by fitness and its failures; then the UI stops and leaves
nothing listening. Each step waits for what it checks to be drawn (evo/tools/screenshots.py walks the pages, as it
does for the docs' screenshots); screenshots of a test run stay in its temporary folder."""
from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest

from kernel_factory.evo.observers.mlflow_view import COLUMNS
from kernel_factory.evo.tools import screenshots as ui

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright")
if not ui.CHROMIUM.is_file():
    pytest.skip("needs Debian's chromium (apt-get install -y chromium; .ci/run does it)", allow_module_level=True)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return ui.make_store(tmp_path_factory.mktemp("quickstart"), ROOT / "configs" / "quickstart.yaml")


@pytest.fixture(scope="module")
def server(store):
    """`kernel-factory ui` on a free loopback port: (start link, port); stopped and checked at the end."""
    with ui.ui_server(store) as (link, port, proc):
        assert listening(port), "kernel-factory ui said it listens before its port did"
        yield link, port
    gone = time.monotonic() + 30
    while (listening(port) or alive(proc.pid)) and time.monotonic() < gone:
        time.sleep(0.2)
    assert not listening(port), "something still listens on the UI's port after it stopped"
    assert not alive(proc.pid), "a process of the UI is left after it stopped"


@pytest.fixture(scope="module")
def page(server):
    with ui.browser() as tab:
        yield tab


def test_start_link_shows_the_parent_runs_with_key_columns(server, page, tmp_path):
    link, port = server
    assert link.startswith(f"http://127.0.0.1:{port}/#/experiments/") and "viewStateShareKey=" in link
    # Each column that a replay has, drawn and wholly inside the 1500-pixel window (waits for it, or fails).
    names = ui.runs_table(page, link, [c for c in COLUMNS if c[1] != "gpu_s_total"])
    assert len(names) == 3 and len(set(names)) == 3, names          # three runs, told apart at a glance
    assert sum(n.startswith("s0 cold") for n in names) == 1 and any(n.startswith("s1 warm") for n in names)
    body = page.inner_text("body")
    assert "3 matching runs" in body and "cand-" not in body        # parents only, no candidate flood
    page.screenshot(path=str(tmp_path / "ui-runs.png"))


def test_a_parent_shows_its_description_lineage_and_candidates(server, store, page, tmp_path):
    link, _ = server
    run_url = ui.parent_run(page, link, re.compile(r"^s1 warm"))
    body = page.inner_text("body")
    assert re.search(r"replayed\s+from replay of NVIDIA H200", body) and "no kernel ran in this run" in body
    best = re.search(r"Best: [0-9a-f]{16} at (\d\.\d{4})x\. Chain: ", body)
    assert best and "seed from run rmsnorm_fwd-" in body           # the warm start, traced to its run
    page.screenshot(path=str(tmp_path / "ui-run.png"))

    ui.lineage_image(page, run_url)

    rows = ui.candidate_table(page, run_url, "fitness")
    assert len(rows) > 10 and {"fitness_change", "gene_diff", "speedup bfloat16:32768x256"} <= set(rows[0])
    fitness = [float(r["fitness"]) for r in rows]
    assert fitness == sorted(fitness, reverse=True), fitness        # sorted by value, not by text
    from kernel_factory.evo.prior import open_store, read_table
    table = read_table(open_store(store / "mlflow.db")[0], run_url.rsplit("/", 1)[-1])
    assert rows[0]["fitness"] == best.group(1) == f"{max(f for f in table['fitness'] if f is not None):.4f}"
    assert all(r["status"] == "ok" for r in rows)                   # failures have no fitness: sorted last
    changed = [r for r in rows if r["gene_diff"]]
    assert changed and all(re.fullmatch(r"(\w+: \S+ -> \S+)(; \w+: \S+ -> \S+)*", r["gene_diff"]) for r in changed)
    page.screenshot(path=str(tmp_path / "ui-candidates.png"))


def test_a_parent_says_what_failed_and_why(server, page, tmp_path):
    """A replayed quickstart's failures are the children its rule refused: counted in the description, each with
    the rule's reason in failures.md."""
    link, _ = server
    run_url = ui.parent_run(page, link, re.compile(r"^s0 cold"))
    assert re.search(r"Failures: \d+ infeasible", page.inner_text("body"))
    ui.failures(page, run_url)
    body = page.inner_text("body")
    assert re.search(r"infeasible \(gen \d+, \w+\)", body) and re.search(r"exceeds? (the )?\d+", body)
    page.screenshot(path=str(tmp_path / "ui-failures.png"))
