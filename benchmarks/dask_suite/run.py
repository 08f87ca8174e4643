"""A package's own tests of its dask code, run plain and with flowgpu's fusion on for every compute, compared.

``--package dask`` (the default): dask's array tests. Copies the installed dask's
``dask/array/tests/`` files (the sdist's where the wheel lacks them) into a folder of their own
with dask's pytest settings. ``--package xarray``: xarray's tests of its dask code (test_dask,
test_computation, test_weighted, test_groupby, test_duck_array_ops, and test_rolling's dask tests),
with xarray's settings and root conftest.py from the sdist of the installed version (tree.py).
Then it runs them twice in fresh processes
(plain; then with ``-p benchmarks.dask_suite.plugin``, which sets dask's ``array_optimize`` to
flowgpu's and ``flowgpu.fuse-ufuncs: true`` for the whole session), both with ``--junitxml``,
and compares: no test that passes plain may fail fused, and none may take more than ``--factor``
times ``max(plain time, --floor)`` fused. Each slower test is then run again, alone and twice in
one process per mode (``-p benchmarks.dask_suite.twice``): one that is no longer slower the second
time paid only for compiling its kernels on the first call, and is listed as such, not as a
regression. Prints the counts of each run and a table of the findings, last; exits 1 on any
regression (or when the fused run never ran a fused kernel, so proved nothing), 2 on bad
arguments. Tests the package skips or xfails, and tests that fail plain, are counted, never regressions.

Examples (from the repository root)::

    python -m benchmarks.dask_suite.run                  # the 11 files of issue 16, -n 2
    python -m benchmarks.dask_suite.run --files test_ufunc test_linalg -n 4 --out /tmp/ds
    python -m benchmarks.dask_suite.run --compare /tmp/ds/plain.xml /tmp/ds/fused.xml
    python -m benchmarks.dask_suite.run --package xarray  # xarray's 6 files of issue 28
    python -m benchmarks.dask_suite.run --package xarray --files test_weighted test_rolling:dask
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness
from benchmarks.dask_suite import compare, tree
from benchmarks.dask_suite.plugin import CENSUS_ENV

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "benchmarks.dask_suite.plugin"
TWICE = "benchmarks.dask_suite.twice"  # runs each test twice in a row: the second run's time is warm


def make_parser() -> argparse.ArgumentParser:
    p = harness.parser("benchmarks.dask_suite.run", __doc__)
    p.add_argument("--package", choices=sorted(tree.SUITES), default="dask",
                   help="whose tests: dask's array tests (default) or xarray's tests of its dask code")
    p.add_argument("--files", nargs="+", default=None, metavar="NAME",
                   help="test files to run (dask/array/tests/ or xarray/tests/); NAME:KEYWORD runs only the "
                        "tests of NAME whose id holds KEYWORD (default: dask's 11 of issue 16, xarray's 6 of issue 28)")
    p.add_argument("-n", "--workers", type=int, default=2,
                   help="pytest-xdist processes per run (0: none; default 2)")
    p.add_argument("--out", default=None, help="folder for the copied tests, the JUnit XMLs and the logs "
                   "(default: a new temporary folder)")
    p.add_argument("--factor", type=float, default=5.0, help="slower than this many times plain is a "
                   "regression (default 5)")
    p.add_argument("--floor", type=float, default=0.2, help="plain times below this many seconds count as "
                   "this for --factor (default 0.2)")
    p.add_argument("--source", default=None, metavar="DIR",
                   help="dask: a dask/ folder holding array/tests/ (and conftest.py), e.g. of an unpacked sdist "
                   "(default: the installed dask's, else its sdist's, downloaded); xarray: the root of a checkout or "
                   "unpacked sdist (default: the installed version's sdist, downloaded)")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (both runs)")
    p.add_argument("--runslow", action="store_true", help="also run the tests dask marks slow (xarray runs its own)")
    p.add_argument("--only", choices=("plain", "fused"), default=None,
                   help="run one of the two (no comparison)")
    p.add_argument("--compare", nargs=2, metavar=("PLAIN_XML", "FUSED_XML"), default=None,
                   help="only compare two JUnit reports written before")
    return p


def _pytest(args: argparse.Namespace, folder: Path, targets: list[str], mode: str, out: Path, *,
            name: str | None = None, workers: int | None = None, extra: Sequence[str] = ()) -> float:
    """One ``mode`` ("plain" or "fused") run of ``targets`` in a fresh process, writing
    ``out/<name>.xml`` and ``out/<name>.log`` (``name``: ``mode``). Returns its wall seconds."""
    name = name or mode
    workers = args.workers if workers is None else workers
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--rootdir", str(folder),
           "-c", str(folder / "pytest.ini"), f"--junitxml={out / (name + '.xml')}", *extra]
    if workers:
        cmd += ["-n", str(workers)]
    if args.keyword:
        cmd += ["-k", args.keyword]
    if args.runslow and tree.SUITES[args.package].runslow:
        cmd.append("--runslow")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop(CENSUS_ENV, None)
    if mode == "fused":
        cmd += ["-p", PLUGIN]
        env[CENSUS_ENV] = str(out / f"census-{name}")
        shutil.rmtree(out / f"census-{name}", ignore_errors=True)
    cmd += targets
    shown = cmd if len(targets) <= 12 else cmd[:-len(targets)] + [f"<{len(targets)} files or tests>"]
    print(f"dask_suite: {name} run: {' '.join(shown)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    lines = (out / f"{name}.log").read_text().strip().splitlines()
    print(f"dask_suite: {name}: {lines[-1] if lines else '(no output)'} (exit {rc}, {wall:.0f} s wall)",
          file=sys.stderr, flush=True)
    if rc not in (0, 1) or not (out / f"{name}.xml").is_file():
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"the {name} pytest run did not complete (exit {rc}); {out / (name + '.log')} ends:\n{tail}")
    return wall


def _recheck(args: argparse.Namespace, folder: Path, out: Path,
             found: list[compare.Regression]) -> list[compare.Regression]:
    """Time each test that was slower fused again, alone and twice in one process per mode: a
    slowdown that is gone the second time was the first call's compilation (not a regression)."""
    slow = [r.test for r in found if r.kind == compare.SLOWER]
    if not slow:
        return found
    warm = {}
    try:
        for mode in ("plain", "fused"):
            name = f"recheck-{mode}"
            _pytest(args, folder, slow, mode, out, name=name, workers=0, extra=["-p", TWICE])
            warm[mode] = compare.read_junit(out / f"{name}.xml")  # the second run of each test wins
    except RuntimeError as e:  # e.g. a test id pytest cannot select again: they stay regressions
        print(f"dask_suite: the recheck of the slower tests failed, they stay regressions: {e}", file=sys.stderr)
        return found
    return compare.recheck(found, warm["plain"], warm["fused"], factor=args.factor, floor_s=args.floor)


def _census(folder: Path) -> dict[str, int]:
    total = {"computes": 0, "fused": 0}
    for f in folder.glob("census-*.json") if folder.is_dir() else ():
        for k, v in json.loads(f.read_text()).items():
            total[k] = total.get(k, 0) + v
    return total


def _fmt_case(case: compare.Case | None) -> str:
    return "did not run" if case is None else f"{case.outcome} {case.time_s:.2f} s"


def _report(report: harness.Report, plain: dict[str, compare.Case], fused: dict[str, compare.Case],
            found: list[compare.Regression], walls: dict[str, float], census: dict[str, int] | None,
            source: str) -> int:
    args = report.args
    runs = {"plain": compare.counts(plain), "fused": compare.counts(fused)}
    head = ["run", "tests", *compare.OUTCOMES, "summed test time (s)", "wall (s)"]
    rows = [[name, c["tests"], *(c[o] for o in compare.OUTCOMES), c["time_s"], walls.get(name)]
            for name, c in runs.items()]
    plain_failures = sorted(t for t, c in plain.items() if c.outcome in ("failed", "error"))
    fixed = sorted(t for t in plain_failures if t in fused and fused[t].outcome == "passed")
    failing = [r for r in found if r.failing]
    report.line(f"{args.package} tests: {source}; files: {' '.join(args.files)}")
    report.line(f"regression: passes plain, fails fused, or fused > {args.factor:g}x max(plain, {args.floor:g} s) "
                "(also when run again alone, warm)")
    if census is not None:
        report.line(f"fused run: {census['computes']} computes went through flowgpu's array_optimize, "
                    f"{census['fused']} of them ran a flowgpu kernel")
    for t in plain_failures:
        report.line(f"  fails plain too (not a regression): {t}: {plain[t].message}")
    for t in fixed:
        report.line(f"  fails plain, passes fused: {t}")
    text = harness.table(head, rows)
    if found:
        text += "\n\n" + harness.table(
            ["finding", "test", "plain", "fused", "ratio", "plain warm", "fused warm", "fused message"],
            [[r.kind, r.test, _fmt_case(r.plain), _fmt_case(r.fused), r.ratio,
              _fmt_case(r.plain_warm) if r.plain_warm else None, _fmt_case(r.fused_warm) if r.fused_warm else None,
              (r.fused.message if r.fused else "").replace("|", "\\|")] for r in found])
    verdict = f"{len(failing)} regression(s)" if failing else "no regressions"
    first = [r for r in found if not r.failing]
    if first:
        extra = sum(r.fused.time_s - r.fused_warm.time_s for r in first if r.fused and r.fused_warm)
        verdict += f", {len(first)} slower on the first call only (compilation: {extra:.1f} s in all)"
    dead = census is not None and census["fused"] == 0
    if dead:
        verdict += "; but the fused run never ran a flowgpu kernel, so it proved nothing"
    what = "dask's array tests" if args.package == "dask" else f"{args.package}'s tests of its dask code"
    report.finish(title=f"{what}, plain against fused: {verdict}", text=text, runs=runs,
                  census=census, findings=[{"test": r.test, "kind": r.kind, "regression": r.failing,
                                            "plain": _fmt_case(r.plain), "fused": _fmt_case(r.fused),
                                            "plain_warm": r.plain_warm and _fmt_case(r.plain_warm),
                                            "fused_warm": r.fused_warm and _fmt_case(r.fused_warm),
                                            "message": r.fused.message if r.fused else ""} for r in found],
                  fails_plain=plain_failures)
    return 1 if failing or dead else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    suite = tree.SUITES[args.package]
    args.files = args.files or list(suite.files)
    report = harness.Report(args, argv)  # from the start: its JSON's wall_s is the whole run's
    if args.compare:
        plain_xml, fused_xml = map(Path, args.compare)
        for p in (plain_xml, fused_xml):
            if not p.is_file():
                print(f"dask_suite: no such JUnit report: {p}", file=sys.stderr)
                return 2
        plain, fused = compare.read_junit(plain_xml), compare.read_junit(fused_xml)
        found = compare.regressions(plain, fused, factor=args.factor, floor_s=args.floor)
        return _report(report, plain, fused, found, {}, None, "JUnit reports given")
    if args.workers and importlib.util.find_spec("xdist") is None:
        print("dask_suite: pytest-xdist is not installed (pip install pytest-xdist); running with -n 0",
              file=sys.stderr)
        args.workers = 0
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dask-suite-"))
    try:
        source, where = (Path(args.source), args.source) if args.source else tree.find_tests(package=args.package)
        files = tree.prepare(out / "tests", args.files, source, suite)
    except tree.SuiteSetupError as e:
        print(f"dask_suite: {e}", file=sys.stderr)
        return 2
    print(f"dask_suite: {len(files)} files from {where} in {out / 'tests'}", file=sys.stderr, flush=True)
    walls = {}
    try:
        for mode in ("plain", "fused") if args.only is None else (args.only,):
            walls[mode] = _pytest(args, out / "tests", files, mode, out)
    except RuntimeError as e:
        print(f"dask_suite: {e}", file=sys.stderr)
        return 1
    if args.only:
        print(f"dask_suite: {args.only} run done: {out / (args.only + '.xml')}", file=sys.stderr)
        return 0
    plain, fused = compare.read_junit(out / "plain.xml"), compare.read_junit(out / "fused.xml")
    found = compare.regressions(plain, fused, factor=args.factor, floor_s=args.floor)
    try:
        found = _recheck(args, out / "tests", out, found)
    except OSError as e:
        print(f"dask_suite: the recheck could not run: {e}", file=sys.stderr)
    return _report(report, plain, fused, found, walls, _census(out / "census-fused"), where)


if __name__ == "__main__":
    sys.exit(main())
