"""Draw a recording of the flowgpu dashboard page (:mod:`benchmarks.probes.dashboard_record`) in a browser.

``python -m benchmarks.probes.dashboard_replay DIR --png docs/dashboard-h200.png [--at SECONDS | --busiest]``

Starts a small local cluster (no workers: nothing is computed) with the Dask dashboard on, registers
the flowgpu dashboard plugin, and gives it a :class:`ReplayBoard` that answers the page with the
recorded views instead of live ones: held at one moment, ``--at SECONDS`` after the recording's
first view, or by default (``--busiest``) the view where the moves between tiers were fastest
while a step was running. Then it loads ``/flowgpu`` in headless Chromium (Selenium driving the
system's ``chromium`` and ``chromedriver``, as ``tests/diagnostics/test_browser.py`` does), waits
until the page has drawn the recorded steps, and saves the screenshot at ``--png``.

The page says it is a replay: the line at its top names the recording, the machine it was made on
(``DIR/summary.json``) and when. ``--serve`` instead keeps the cluster up and prints the page's
link, the board going through the recording in its own time, again and again.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import sys
import time
from typing import Any

from distributed import Client, LocalCluster

from benchmarks import harness
from flowgpu.diagnostics import monitor
from flowgpu.diagnostics.dashboard import PLUGIN_NAME

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

# The steps the page shows, also inside Bokeh's shadow roots, and how many plots it has drawn.
PAGE_STATE = """
const out = {steps: {}, head: null, canvases: 0};
function walk(root) {
  for (const el of root.querySelectorAll('*')) {
    if (el.dataset && el.dataset.step && el.tagName === 'TR') out.steps[el.dataset.step] = el.dataset.state;
    if (el.id === 'flowgpu-run') out.head = el.textContent;
    if (el.tagName === 'CANVAS') out.canvases += 1;
    if (el.shadowRoot) walk(el.shadowRoot);
  }
}
walk(document);
return out;
"""


def load(folder: str) -> tuple[list[dict], dict]:
    """The recorded views (``[{"t", "view"}]``, in time order) and the recording's summary."""
    try:
        with open(os.path.join(folder, "board.jsonl")) as f:
            views = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        raise SystemExit(f"error: no recording in {folder}: {e.strerror} (make one with "
                         "python -m benchmarks.probes.dashboard_record --out DIR)") from None
    views = [v for v in views if v["view"].get("run")] or views  # those before the run started show nothing
    if not views:
        raise SystemExit(f"error: {folder}/board.jsonl holds no board views; record again")
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        meta = {}
    return sorted(views, key=lambda v: v["t"]), meta


def busiest(views: list[dict]) -> int:
    """The view whose latest memory sample moved the most bytes per second, among those where a
    step is running (else among all)."""
    def gbps(v: dict) -> float:
        g = v["view"]["memory"]["series"]["gbps"]
        return g[-1] if g else 0.0

    running = [i for i, v in enumerate(views) if any(s["state"] == "running" for s in v["view"]["steps"])]
    return max(running or range(len(views)), key=lambda i: gbps(views[i]))


def at(views: list[dict], seconds: float) -> int:
    """The last view recorded at most ``seconds`` after the first."""
    times = [v["t"] - views[0]["t"] for v in views]
    return max(bisect.bisect_right(times, seconds) - 1, 0)


def banner(meta: dict, view: dict, t: float) -> str:
    """What the page's top line says: a replay, of what, made where and when."""
    env = meta.get("environment") or {}
    gpu = f"{env['gpu']} ({env.get('gpu_memory_GiB')} GiB)" if env.get("gpu") else "no GPU"
    machine = f"{env.get('node', 'unknown machine')}, {gpu}"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f"REPLAY of a recording made on {machine} at {when}, not a live run: {view['run']['name']}"


class ReplayBoard:
    """Stands in for the plugin's :class:`~flowgpu.diagnostics.livestate.Board`: ``view()`` is a
    recorded view (held at ``index``, or with ``play``, the one of the recording's own time since
    the board was made, looping), its run named as a replay; what the scheduler feeds it is ignored."""

    def __init__(self, views: list[dict], meta: dict, index: int = -1, play: bool = False):
        self.views, self.meta, self.index, self.play = views, meta, index, play
        self._t0 = time.time()

    def _current(self) -> dict:
        if self.play:
            span = self.views[-1]["t"] - self.views[0]["t"] + 2.0
            return self.views[at(self.views, (time.time() - self._t0) % span)]
        return self.views[self.index]

    def view(self, run_id: str | None = None) -> dict[str, Any]:
        rec = self._current()
        view = json.loads(json.dumps(rec["view"]))  # the page must not change the recording
        view["run"] = {**view["run"], "name": banner(self.meta, view, rec["t"])}
        return view

    # what the plugin feeds a live board: nothing of this cluster is shown
    def publish(self, *args: Any, **kwargs: Any) -> None: ...
    def finish(self, *args: Any, **kwargs: Any) -> None: ...
    def add_tasks(self, *args: Any, **kwargs: Any) -> None: ...
    def transition(self, *args: Any, **kwargs: Any) -> None: ...
    def sample(self, *args: Any, **kwargs: Any) -> None: ...


def browser(width: int = 1400, height: int = 1400):
    """Headless Chromium from the system's packages, driven by Selenium."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        raise SystemExit("error: Chromium is not installed (Debian: apt-get install -y chromium chromium-driver)")
    from selenium import webdriver  # noqa: PLC0415 - only the replay needs a browser
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(60)
    return driver


def screenshot(link: str, png: str, steps: list[str], timeout: float = 60.0) -> dict:
    """Load ``link``, wait until the page shows ``steps`` and its plots, save ``png``; the page's state."""
    driver = browser()
    try:
        driver.get(link)
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            state = driver.execute_script(PAGE_STATE)
            if set(steps) <= set(state["steps"]) and state["head"] and state["canvases"] >= 3:
                break
            time.sleep(0.25)
        else:
            raise SystemExit(f"error: the page at {link} did not draw the recording in {timeout:.0f} s: {state}")
        time.sleep(1.5)  # Bokeh draws the plots' lines after their canvases appear
        chrome = driver.get_window_size()["height"] - driver.execute_script("return window.innerHeight")
        tall = driver.execute_script("return Math.ceil(Math.max(...[...document.querySelectorAll('.bk-Column')]"
                                     ".map(e => e.getBoundingClientRect().bottom)))")  # the page's Bokeh root
        driver.set_window_size(driver.get_window_size()["width"], tall + chrome + 16)  # the whole page, no more
        time.sleep(0.5)
        os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
        driver.save_screenshot(png)
        return state
    finally:
        driver.quit()


def replay(folder: str, png: str | None, seconds: float | None = None, serve: bool = False) -> dict:
    views, meta = load(folder)
    index = busiest(views) if seconds is None else at(views, seconds)
    board = ReplayBoard(views, meta, index, play=serve)
    with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        if not monitor.install(client):
            raise SystemExit("error: the flowgpu dashboard plugin could not be installed")
        cluster.scheduler.plugins[PLUGIN_NAME].board = board  # the page reads the board when it is opened
        link = monitor.page_link(f"http://127.0.0.1:{cluster.scheduler.http_server.port}/status")
        if serve:
            print(f"replaying {folder} at {link} (Ctrl-C ends)", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return {}
        steps = [s["id"] for s in views[index]["view"]["steps"]]
        state = screenshot(link, png, steps)
    when = views[index]["t"] - views[0]["t"]
    print(f"{png}: view {index + 1} of {len(views)}, {when:.1f} s into the recording; {state['head']}", flush=True)
    return {"index": index, "seconds": when, "page": state}


def parser():
    p = harness.parser(__spec__.name if __spec__ else "benchmarks.probes.dashboard_replay", __doc__)
    p.add_argument("folder", nargs="?", default="dashboard-recording",
                   help="a recording's folder (board.jsonl, summary.json; default dashboard-recording)")
    p.add_argument("--png", default=None, help="where the screenshot goes (e.g. docs/dashboard-h200.png)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--at", type=float, default=None, metavar="SECONDS",
                       help="show the view recorded SECONDS after the first")
    which.add_argument("--busiest", action="store_true",
                       help="show the view where the moves between tiers were fastest while a step ran (default)")
    p.add_argument("--serve", action="store_true", help="keep the page up, going through the recording, instead")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if not a.serve and not a.png:
        parser().error("give --png PATH (or --serve)")
    out = replay(a.folder, a.png, a.at, a.serve)
    if a.json:
        harness.write_json(a.json, {"command": harness.command(a, argv), "png": a.png, **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
