"""The wall time of one ``flowgpu run`` of the quickstart, as a user's shell sees it: cold (the run
starts its own cluster), against a warm cluster (``flowgpu cluster start`` first), and up to date
(nothing changed since the last run: no array work, no cluster needed).

Each is a fresh ``python -m flowgpu run`` process, timed from outside; the median of ``--repeats``.

    python -m benchmarks.batch.rerun --cpu --n 2000
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

SPEC = Path(__file__).resolve().parents[2] / "pipelines" / "quickstart.yaml"


def flowgpu(*args: str, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flowgpu", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"flowgpu {' '.join(args)} failed: {done.stderr[-2000:]}")
    return wall, done


def median(fn, repeats: int) -> float:
    return sorted(fn() for _ in range(repeats))[repeats // 2]


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="CPU workers (the 2-core CI machine's figures)", repeats=3)
    p.add_argument("--n", type=int, default=2000, help="the quickstart's n (rows and columns)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    with tempfile.TemporaryDirectory(prefix="flowgpu-bench-rerun-") as tmp:
        env = {**os.environ, "DASK_FLOWGPU__CLUSTER__DIRECTORY": os.path.join(tmp, "cluster"),
               "DASK_FLOWGPU__CACHE__DIRECTORY": os.path.join(tmp, "cache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as on a user's machine: modules compiled once, not per run
        run = ["run", str(SPEC), "-q", "--json", "--set", f"params.n={args.n}",
               "--set", f"params.out={os.path.join(tmp, 'out')}", *(["--backend", "cpu"] if args.cpu else [])]
        cold = median(lambda: flowgpu(*run, "--standalone", "--force", env=env)[0], args.repeats)
        flowgpu("cluster", "start", *(["--backend", "cpu"] if args.cpu else []), env=env)
        try:
            flowgpu(*run, "--force", env=env)  # the workers' first run loads their code
            warm = median(lambda: flowgpu(*run, "--force", env=env)[0], args.repeats)
            wall, done = flowgpu(*run, env=env)
            fresh = json.loads(done.stdout)
            assert all(o["status"] == "up-to-date" for o in fresh["outputs"].values()), fresh
            up_to_date = median(lambda: flowgpu(*run, env=env)[0], args.repeats)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import flowgpu.cli"], env=env, check=True)
            imports = time.perf_counter() - started
        finally:
            flowgpu("cluster", "stop", env=env)
    report.line(f"quickstart at n={args.n}; `python -c 'import flowgpu.cli'` alone takes {imports:.2f} s")
    report.finish(("flowgpu run", "seconds"), [
        ("cold: starts its own cluster, computes", round(cold, 2)),
        ("warm: joins the running cluster, computes", round(warm, 2)),
        ("up to date: nothing changed, computes nothing", round(up_to_date, 2)),
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
