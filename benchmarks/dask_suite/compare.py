"""Read two JUnit XML reports (plain, fused) and find what fusion broke or slowed down.

A *regression* is a test that passed plain and, fused, failed, errored, was skipped or xfailed, or
did not run at all; or one that passed both ways but took more than ``factor`` times as long fused
as ``max(plain time, floor)`` (the floor keeps micro-tests from flaking). Tests that dask itself
skips or xfails, or that fail plain, are counted but never regressions.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Case", "Regression", "read_junit", "counts", "regressions", "recheck", "OUTCOMES"]

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")
FAILS = "fails fused"
SLOWER = "slower fused"
FIRST_CALL = "slower on first call only"  # not slower when run again warm: the kernel's compilation


@dataclass(frozen=True)
class Case:
    outcome: str  # one of OUTCOMES
    time_s: float
    message: str = ""  # the first line of the failure, error or skip


@dataclass(frozen=True)
class Regression:
    test: str
    kind: str  # FAILS, SLOWER or FIRST_CALL
    plain: Case
    fused: Case | None
    plain_warm: Case | None = None  # the recheck's times, run again in a process that ran it once
    fused_warm: Case | None = None

    @property
    def failing(self) -> bool:
        return self.kind != FIRST_CALL

    @property
    def ratio(self) -> float | None:
        """Fused time over plain time (plain at least 1 ms), for the slower findings."""
        if self.kind == FAILS or self.fused is None:
            return None
        return self.fused.time_s / max(self.plain.time_s, 1e-3)


def _first_line(el: ET.Element) -> str:
    text = el.get("message") or (el.text or "")
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def read_junit(path: str | Path) -> dict[str, Case]:
    """``{"test_file.py::name[params]": Case}`` for every test case of a pytest JUnit XML report."""
    cases: dict[str, Case] = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        module, _, cls = (tc.get("classname") or "").partition(".")
        name = f"{module}.py::" + (f"{cls}::" if cls else "") + (tc.get("name") or "")
        outcome, message = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), _first_line(child)
                break
            if child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                message = _first_line(child)
        if name in cases and cases[name].outcome != "passed":  # a teardown error after a pass or fail
            continue
        cases[name] = Case(outcome, float(tc.get("time") or 0.0), message)
    return cases


def counts(cases: dict[str, Case]) -> dict[str, float]:
    """How many of each outcome, the number of tests and the summed test time."""
    c = Counter(case.outcome for case in cases.values())
    return {**{o: c.get(o, 0) for o in OUTCOMES}, "tests": len(cases),
            "time_s": round(sum(case.time_s for case in cases.values()), 2)}


def regressions(plain: dict[str, Case], fused: dict[str, Case], *, factor: float = 5.0,
                floor_s: float = 0.2) -> list[Regression]:
    """Every test that passes plain but not fused, or is ``factor`` times slower fused."""
    found = []
    for test, p in sorted(plain.items()):
        if p.outcome != "passed":
            continue
        f = fused.get(test)
        if f is None or f.outcome != "passed":
            found.append(Regression(test, FAILS, p, f))
        elif _slower(p, f, factor, floor_s):
            found.append(Regression(test, SLOWER, p, f))
    return found


def _slower(plain: Case, fused: Case, factor: float, floor_s: float) -> bool:
    return fused.time_s > factor * max(plain.time_s, floor_s)


def recheck(found: list[Regression], plain_warm: dict[str, Case], fused_warm: dict[str, Case], *,
            factor: float = 5.0, floor_s: float = 0.2) -> list[Regression]:
    """``found`` with each SLOWER finding timed again warm: it stays SLOWER if it is slower warm too
    (or did not pass again), else becomes FIRST_CALL."""
    out = []
    for r in found:
        p, f = plain_warm.get(r.test), fused_warm.get(r.test)
        if r.kind != SLOWER or p is None or f is None:
            out.append(r)
            continue
        warm_ok = p.outcome == f.outcome == "passed" and not _slower(p, f, factor, floor_s)
        out.append(Regression(r.test, SLOWER if not warm_ok else FIRST_CALL, r.plain, r.fused, p, f))
    return out
