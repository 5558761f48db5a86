"""The screenshots of docs/mlflow-ui.md, made as a user sees the MLflow UI: three quickstart runs, `kernel-factory
ui`, the start link, a parent run, its lineage, its candidate table sorted by fitness and its failures, in headless
Chromium (Debian's) driven by playwright (`pip install -e '.[test]'`). tests/test_ui_browser.py walks the same pages
with these functions and checks what they show; only this command writes screenshots:

    python -m kernel_factory.evo.tools.screenshots docs/img
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..observers.mlflow_view import COLUMNS, column_key

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1500, "height": 950}
WAIT_MS = 120_000   # the most that one thing may take to be drawn: a loaded 2-core machine takes tens of seconds
NAME = re.compile(r"^s\d (cold|warm<\d+) \d\.\d{3}x [0-9a-f]{6}$")   # a parent run's name (mlflow_view.run_name)
SHOTS = ("ui-runs.png", "ui-run.png", "ui-lineage.png", "ui-candidates.png", "ui-failures.png")
# MLflow's assistant panel opens by itself on a first visit and covers a third of the page (so the runs table draws
# fewer columns); a user closes it once and the browser remembers that under this key. These pages are the ones a
# user sees from then on.
ASSISTANT_SEEN = "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true')"


def make_store(where: Path, config: Path) -> Path:
    """Three quickstart runs in `where`, as a new user makes them: twice with the default seed, once with seed=1.
    Returns their runs/ folder (store and artifacts)."""
    from ..config import load
    from ..run import execute
    cwd = os.getcwd()
    os.chdir(where)   # the quickstart's store and runs folder are relative, as from a user's shell
    try:
        with contextlib.redirect_stdout(sys.stderr):   # each run's result line: progress here, not our output
            for seed in (0, 0, 1):
                execute(load(str(config), (f"seed={seed}",)))
    finally:
        os.chdir(cwd)
    return where / "runs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ui_server(runs: Path) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """`kernel-factory ui` over runs/ on a free loopback port, as a user starts it: (start link, port, process) once
    it says that it listens (it says so after a connect succeeds); stopped with SIGTERM when the block ends."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kernel_factory.evo.tools.cli", "ui", "--store",
                             str(runs / "mlflow.db"), "--artifacts", str(runs / "artifacts"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said: list[str] = []
        while not said or "listening on" not in said[-1]:
            said.append(proc.stderr.readline())
            if not said[-1] and proc.poll() is not None:
                raise RuntimeError("kernel-factory ui ended before it listened:\n" + "".join(said[-20:]))
        links = [m.group(1) for line in said if (m := re.search(r"^start here \([^)]*\): (\S+)", line))]
        # The server keeps logging to this pipe: read on, or it fills and the server stops.
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield links[0] if links else "", port, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # as Ctrl-C or a service manager stops it
        proc.wait(timeout=60)


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A page in headless Chromium at the docs' size, for a user who has closed MLflow's assistant once."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            context = chromium.new_context(viewport=VIEWPORT)
            context.add_init_script(ASSISTANT_SEEN)
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            yield page
        finally:
            chromium.close()


def header(page: Any, name: str) -> Any:
    """The artifact viewer's column header with this exact text."""
    return page.locator("[role=columnheader]", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$"))


def runs_table(page: Any, link: str, columns: Sequence[tuple[str, str]]) -> list[str]:
    """The start link's runs table, once its runs are drawn and each of `columns` ((kind, name) as in the saved
    view) is drawn wholly inside the window; returns the run names."""
    from playwright.sync_api import expect
    page.goto(link)
    page.get_by_text(NAME).first.wait_for()
    for kind, name in columns:
        cell = page.locator(f'[role=columnheader][col-id="{column_key(kind, name)}"]')
        expect(cell).to_be_in_viewport(ratio=1.0, timeout=WAIT_MS)
        expect(cell).to_contain_text(name, timeout=WAIT_MS)
    return [n.strip() for n in page.get_by_text(NAME).all_inner_texts()]


def parent_run(page: Any, link: str, name: re.Pattern) -> str:
    """A parent run's page, reached as a user does (its name in the runs table), once its description is drawn;
    returns the run's address."""
    page.goto(link)
    page.get_by_role("link", name=name).first.click()
    page.get_by_text(re.compile(r"^Best: ")).first.wait_for()
    return page.url.split("?")[0]


def artifact(page: Any, run_url: str, path: str) -> None:
    """A run's artifact, in a freshly loaded artifact tab: the tab keeps showing its file when only the address
    changes (from one artifact to another)."""
    page.goto("about:blank")
    page.goto(f"{run_url}/artifacts/{path}")


def lineage_image(page: Any, run_url: str) -> None:
    artifact(page, run_url, "lineage/lineage.png")
    page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth > 1000)",
                           timeout=WAIT_MS)


def candidate_table(page: Any, run_url: str, by: str = "fitness") -> list[dict[str, str]]:
    """The candidate table sorted by `by`, highest first (the viewer sorts text up on the first click, down on the
    second); the rows of its first page as {column: cell}."""
    artifact(page, run_url, "candidates.json")
    column = header(page, by)
    for order in ("ascending", "descending"):
        column.click()
        page.locator(f"[role=columnheader][aria-sort={order}]", has_text=by).wait_for()
    names = [h.strip() for h in page.locator("[role=columnheader]").all_inner_texts()]
    rows = page.locator("[role=row]:has([role=cell])")
    return [dict(zip(names, (c.strip() for c in row.locator("[role=cell]").all_inner_texts())))
            for row in rows.all()]


def failures(page: Any, run_url: str) -> None:
    artifact(page, run_url, "failures.md")
    page.get_by_text("refused by the problem's rule before compiling").first.wait_for()


def shoot(out: Path, config: Path) -> list[Path]:
    """Three quickstart runs in a temporary folder, the UI over them, and each page of SHOTS into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in SHOTS]
    with tempfile.TemporaryDirectory(prefix="kf-shots-") as tmp:
        runs = make_store(Path(tmp), config.resolve())
        with ui_server(runs) as (link, _, _), browser() as page:
            runs_table(page, link, [c for c in COLUMNS if c[1] != "gpu_s_total"])   # replays have the other
            page.screenshot(path=str(paths[0]))
            run_url = parent_run(page, link, re.compile(r"^s1 warm"))
            page.screenshot(path=str(paths[1]))
            lineage_image(page, run_url)
            page.screenshot(path=str(paths[2]))
            candidate_table(page, run_url)
            page.screenshot(path=str(paths[3]))
            failures(page, parent_run(page, link, re.compile(r"^s0 cold")))
            page.screenshot(path=str(paths[4]))
    for path in paths:
        compact(path)
    return paths


def compact(path: Path) -> None:
    """A screenshot re-saved with a palette of 256 colours (no dithering): the UI's pages hold a few thousand
    colours, mostly the anti-aliased edges of text, and the PNG comes to about two fifths of the bytes, which keeps
    docs/ under its size limit. Pillow comes with matplotlib."""
    from PIL import Image
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.screenshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the folder the PNGs go to (docs/img for the docs)")
    parser.add_argument("--config", default="configs/quickstart.yaml", help="the runs' config (the quickstart's)")
    args = parser.parse_args(argv)
    needs = [(Path(args.config).is_file(), f"no config at {args.config!r}: run from the repository's root or pass "
                                           "--config"),
             (CHROMIUM.is_file(), f"no browser at {CHROMIUM}: apt-get install chromium"),
             (importlib.util.find_spec("playwright") is not None, "no playwright: pip install -e '.[test]'")]
    problem = next((why for met, why in needs if not met), "")
    if problem:
        print(f"screenshots: error: {problem}", file=sys.stderr)
        return 2
    for path in shoot(Path(args.out), Path(args.config)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
