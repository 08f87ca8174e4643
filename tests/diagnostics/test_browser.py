"""The flowgpu page and the run report in a real browser: headless Chromium from the system's
packages (``apt-get install -y chromium chromium-driver``; ``.ci/run`` installs them), driven by
Selenium. Screenshots go to ``$FLOWGPU_SCREENSHOTS`` (``docs/`` for the README) or the test's tmp dir."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
BLOCKS = 16

SPEC = """\
version: 1
name: browser
params: {{n: 2000}}
inputs:
  x: {{source: normal, shape: ["${{params.n}}", 400], dtype: float64, seed: 7, chunks: [{rows}, -1]}}
steps:
  a: {{op: map_blocks, inputs: [x], args: {{function: "tests.diagnostics.slowfuncs:slow_scale", dtype: float64,
      kwargs: {{seconds: 0.6, factor: 2.0}}}}}}
  b: {{op: map_blocks, inputs: [a], args: {{function: "tests.diagnostics.slowfuncs:slow_scale", dtype: float64,
      kwargs: {{seconds: 0.6, factor: -1.0}}}}}}
  c: {{op: mean, inputs: [b], args: {{axis: 0}}}}
  total: {{op: sum, inputs: [c]}}
outputs:
  a: {{from: a, sink: npy, path: out/a.npy}}
  b: {{from: b, sink: npy, path: out/b.npy}}
  total: {{from: total}}
"""

# Every element of the page, also inside Bokeh's shadow roots, that carries one of our data- attributes.
_WALK = """
const out = {steps: {}, workers: [], status: null};
function walk(root) {
  for (const el of root.querySelectorAll('*')) {
    if (el.dataset) {
      if (el.dataset.step && el.tagName === 'TR') out.steps[el.dataset.step] = el.dataset.state;
      if (el.dataset.worker) out.workers.push([Number(el.dataset.bytes), Number(el.dataset.peak)]);
      if (el.id === 'flowgpu-run') out.status = el.dataset.status;
    }
    if (el.shadowRoot) walk(el.shadowRoot);
  }
}
walk(document);
return out;
"""


def _shots(tmp_path) -> pathlib.Path:
    where = pathlib.Path(os.environ.get("FLOWGPU_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        pytest.skip("Chromium is not installed (Debian: apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra has it)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """``flowgpu run`` of a spec whose blocks take 0.6 s each (about 20 s in all on 2 cores), with a report."""
    where = tmp_path_factory.mktemp("browser-run")
    (where / "spec.yaml").write_text(SPEC.format(rows=2000 // BLOCKS))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "flowgpu", "run", "spec.yaml", "--workers", "1", "--standalone",
                             "--report", "run.html", "--summary", "summary.json"], cwd=where, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # the dashboard link comes first, before any work
        lines.append(line)
        if "dashboard:" in line:
            break
    link = re.search(r"dashboard: (\S+)", "".join(lines))
    yield proc, (link.group(1) if link else None), where, lines
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def _finish(proc, lines) -> str:
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=240) == 0, "".join(lines)
    return "".join(lines)


def test_the_flowgpu_page_follows_a_run(browser, slow_run, tmp_path):
    proc, link, where, lines = slow_run
    assert link and link.endswith("/flowgpu"), "".join(lines)  # the printed link goes straight to the page
    browser.get(link)
    seen: dict[str, list[str]] = {}
    memory = 0
    shot = False
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline:
        try:
            state = browser.execute_script(_WALK)
        except Exception:  # noqa: BLE001 - the page went away with the cluster at the end of the run
            break
        for step, st in state["steps"].items():
            if not seen.get(step) or seen[step][-1] != st:
                seen.setdefault(step, []).append(st)
        memory = max([memory] + [max(b, p) for b, p in state["workers"]])
        now = set(state["steps"].values())
        if not shot and {"running", "done"} <= now and memory:
            browser.save_screenshot(str(_shots(tmp_path) / "dashboard.png"))  # mid-run: a done, b running
            shot = True
        if state["status"] in ("ok", "failed") or proc.poll() is not None:
            break
        time.sleep(0.25)
    _finish(proc, lines)
    assert {"x", "a", "b", "c", "total", "out:a", "out:b", "out:total"} <= set(seen), seen  # every step of the spec
    moved = [s for s, states in seen.items() if "running" in states and "done" in states[states.index("running"):]]
    assert moved, seen  # at least one step went from running to done while the page was open
    assert memory > 0  # the memory panel showed bytes held in the workers' store
    assert shot


def test_the_run_report_in_the_browser(browser, slow_run, tmp_path):
    proc, _, where, lines = slow_run
    _finish(proc, lines) if proc.returncode is None else None
    report = where / "run.html"
    browser.get(report.as_uri())
    rows = browser.execute_script("return [...document.querySelectorAll('#steps tr[data-step]')].map(r => "
                                  "[r.dataset.step, r.cells[2].textContent])")
    assert rows == [["x", "done"], ["a", "done"], ["b", "done"], ["c", "done"], ["total", "done"]]
    bars = browser.execute_script("return [...document.querySelectorAll('#plot-time-per-step rect.bar')]"
                                  ".map(r => [r.dataset.step, r.getBBox().width])")
    widths = dict(bars)
    assert min(widths["a"], widths["b"]) > max(widths["c"], widths["total"])  # 16 blocks of 0.6 s each
    assert browser.execute_script("return document.querySelectorAll('#plot-spilling polyline').length") == 1
    assert browser.execute_script("return document.querySelectorAll('#plot-tiers polyline').length") == 3
    browser.switch_to.frame("dask-report")
    assert "Dask Performance Report" in browser.execute_script("return document.documentElement.outerHTML")
    deadline = time.monotonic() + 60
    rendered = 0
    while not rendered and time.monotonic() < deadline:  # Bokeh draws dask's report (no network needed)
        rendered = browser.execute_script("return [...document.querySelectorAll('*')].filter(e => e.shadowRoot).length")
        time.sleep(0.2)
    browser.switch_to.default_content()
    assert rendered
    browser.save_screenshot(str(_shots(tmp_path) / "report.png"))
    out = np.load(where / "out" / "b.npy")
    assert out.shape == (2000, 400) and np.isfinite(out).all()
