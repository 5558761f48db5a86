"""The MLflow UI as a user sees it, in a real browser (Debian's chromium driven by playwright): three quickstart
runs, `kernel-factory ui`, the printed start link; the parent runs with their key columns, a run's description,
its lineage image and its candidate table with gene diffs; then the UI stops and leaves nothing listening.
Screenshots go to docs/img/ (docs/mlflow-ui.md shows them)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_factory.evo import config
from kernel_factory.evo.run import execute

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "img"
NAME = re.compile(r"^s\d (cold|warm<\d+) \d\.\d{3}x [0-9a-f]{6}$")

pytestmark = pytest.mark.slow
playwright = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]' brings playwright")
if not CHROMIUM.is_file():
    pytest.skip("needs Debian's chromium (apt-get install -y chromium; .ci/run does it)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Three quickstart runs, as a new user makes them: twice with the default seed, once with seed=1."""
    where = tmp_path_factory.mktemp("quickstart")
    cwd = os.getcwd()
    os.chdir(where)   # the quickstart's store and runs folder are relative, as from a user's shell
    try:
        for seed in (0, 0, 1):
            execute(config.load(str(ROOT / "configs" / "quickstart.yaml"), (f"seed={seed}",)))
    finally:
        os.chdir(cwd)
    return where / "runs"


@pytest.fixture(scope="module")
def ui(store):
    """`kernel-factory ui` on a free loopback port: (start link, port); stopped and checked at the end."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernel_factory.evo.tools.cli", "ui", "--store",
                             str(store / "mlflow.db"), "--artifacts", str(store / "artifacts"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    link, deadline = None, time.monotonic() + 120
    while link is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "kernel-factory ui ended before printing its start link"
        found = re.search(r"start here \(rmsnorm_fwd\): (\S+)", line)
        link = found.group(1) if found else None
    while not listening(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert link and listening(port), "the UI did not come up within 120 s"
    yield link, port
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    gone = time.monotonic() + 30
    while listening(port) and time.monotonic() < gone:
        time.sleep(0.5)
    assert not listening(port), "something still listens on the UI's port after it stopped"
    while alive(proc.pid) and time.monotonic() < gone:
        time.sleep(0.5)
    assert not alive(proc.pid), "a process of the UI is left after it stopped"


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def page(ui):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        tab = browser.new_page(viewport={"width": 1500, "height": 950})
        tab.set_default_timeout(60_000)
        yield tab
        browser.close()


def settle(page, text: str | re.Pattern) -> None:
    page.get_by_text(text).first.wait_for()
    page.wait_for_timeout(1500)   # the grid's cells and images finish drawing after their data arrives


def close_assistant(page) -> None:
    """MLflow's assistant opens itself on a first visit and covers a third of the page; a user closes it once."""
    close = page.get_by_role("button", name=re.compile(r"^close", re.I))
    if page.get_by_text("MLflow Assistant").count() and close.count():
        close.last.click()


def test_start_link_shows_the_parent_runs_with_key_columns(ui, page):
    link, port = ui
    assert link.startswith(f"http://127.0.0.1:{port}/#/experiments/") and "viewStateShareKey=" in link
    page.goto(link)
    settle(page, NAME)
    close_assistant(page)
    names = [n.strip() for n in page.get_by_text(NAME).all_inner_texts()]
    assert len(names) == 3 and len(set(names)) == 3, names          # three runs, told apart at a glance
    assert sum(n.startswith("s0 cold") for n in names) == 1 and any(n.startswith("s1 warm") for n in names)
    body = page.inner_text("body")
    for column in ("final_best_fitness", "evaluations_total", "failures_total", "kf.evaluator",
                   "kf.warm_start_runs", "recorded_gpu_s_total"):
        assert column in body, column
    assert "3 matching runs" in body and "cand-" not in body        # parents only, no candidate flood
    page.screenshot(path=str(SHOTS / "ui-runs.png"))


def test_a_parent_shows_its_description_lineage_and_candidates(ui, page):
    link, _ = ui
    page.goto(link)
    settle(page, NAME)
    page.get_by_role("link", name=re.compile(r"^s1 warm")).first.click()
    settle(page, "Description")
    close_assistant(page)
    body = page.inner_text("body")
    assert re.search(r"replayed\s+from replay of NVIDIA H200", body) and "no kernel ran in this run" in body
    assert re.search(r"Best: [0-9a-f]{16} at \d\.\d{4}x\. Chain: ", body)
    assert "seed from run rmsnorm_fwd-" in body                    # the warm start, traced to its run
    page.get_by_text("Description").first.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "ui-run.png"))

    run_url = page.url.split("?")[0]
    page.goto(f"{run_url}/artifacts/lineage/lineage.png")
    page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth > 1000)")
    page.screenshot(path=str(SHOTS / "ui-lineage.png"))

    page.get_by_text("candidates.json", exact=True).first.click()
    settle(page, "gene_diff")
    page.locator("li[title='2']").first.click()   # page 1 is generation 0, which has no parents to differ from
    page.wait_for_timeout(1500)
    body = page.inner_text("body")
    assert re.search(r"\w+: \S+ -> \S+", body), "no gene diff in the candidate table"
    assert "fitness_change" in body and "speedup bfloat16:32768x256" in body
    page.screenshot(path=str(SHOTS / "ui-candidates.png"))


def test_a_parent_says_what_failed_and_why(ui, page):
    """A replayed quickstart's failures are the children its rule refused: counted in the description, each with
    the rule's reason in failures.md."""
    link, _ = ui
    page.goto(link)
    settle(page, NAME)
    page.get_by_role("link", name=re.compile(r"^s0 cold")).first.click()
    settle(page, "Description")
    close_assistant(page)
    assert re.search(r"Failures: \d+ infeasible", page.inner_text("body"))
    page.goto(f"{page.url.split('?')[0]}/artifacts/failures.md")
    settle(page, "refused by the problem's rule before compiling")
    body = page.inner_text("body")
    assert re.search(r"infeasible \(gen \d+, \w+\)", body) and re.search(r"exceeds? (the )?\d+", body)
    page.screenshot(path=str(SHOTS / "ui-failures.png"))
