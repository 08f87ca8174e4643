"""What the flowgpu dashboard page shows, kept on the scheduler: runs, their steps' progress, memory.

A :class:`Board` is plain Python (testable without a scheduler), fed by the scheduler plugin
(:mod:`flowgpu.diagnostics.dashboard`); :meth:`Board.view` is what the page and the run report read.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from graphlib import TopologicalSorter
from typing import Any, Hashable, Iterable

__all__ = ["Board", "TIERS", "MOVES", "layer_of"]

TIERS = ("device", "host", "disk")
MOVES = ("device_to_host", "host_to_device", "host_to_disk", "disk_to_host", "disk_to_device")
_RUNS_KEPT = 200


@dataclass
class _Step:
    total: int = 0
    done: set = field(default_factory=set)
    processing: int = 0
    erred: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass
class _Run:
    id: str
    name: str
    graph: dict
    item: str | None
    batch: str | None
    started: float
    states: dict[str, str]  # fixed states the client knows (e.g. "up-to-date")
    steps: dict[str, _Step]
    status: str = "running"
    finished: float | None = None
    error: str | None = None
    peak: dict[str, dict[str, int]] = field(default_factory=dict)  # worker -> {"store", "process"} bytes
    unwritten: set[str] = field(default_factory=set)  # output nodes the client says were not moved into place


def layer_of(key: Hashable) -> str:
    """The Dask layer a task key belongs to: its name, or the name that starts a tuple key."""
    return str(key[0]) if isinstance(key, tuple) and key else str(key)


class Board:
    """Runs and memory as the dashboard page shows them."""

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}
        self._layers: dict[str, tuple[str, str]] = {}  # layer name -> (run, node)
        self._keys: dict[Hashable, tuple[str, str]] = {}
        self._series: deque = deque(maxlen=900)  # (t, {worker: sample}): 15 minutes, one a second

    # -- fed by the client (through the plugin) ------------------------------------------------------
    def publish(self, run_id: str, graph: dict, layers: dict[str, str], item: str | None = None,
                batch: str | None = None, states: dict[str, str] | None = None, now: float | None = None) -> None:
        """A run starts: its step graph, and ``layers`` (Dask layer name -> node id)."""
        steps = {n["id"]: _Step() for n in graph["nodes"]}
        self.runs[run_id] = _Run(run_id, graph.get("name", "pipeline"), graph, item, batch,
                                 time.time() if now is None else now, dict(states or {}), steps)
        self._layers.update({layer: (run_id, node) for layer, node in layers.items() if node in steps})
        while len(self.runs) > _RUNS_KEPT:
            old = next(iter(self.runs))
            del self.runs[old]
            self._unkey(old)

    def _unkey(self, run_id: str) -> None:
        self._layers = {k: v for k, v in self._layers.items() if v[0] != run_id}
        self._keys = {k: v for k, v in self._keys.items() if v[0] != run_id}

    def finish(self, run_id: str, status: str, error: str | None = None, written: list[str] | None = None,
               now: float | None = None) -> None:
        """The client says how the run ended (``ok`` or ``failed``) and, with ``written``, which outputs
        were moved into place: the others are ``not-written``, whatever their tasks did (a failed run's
        writes finish into a staging folder that is then removed)."""
        run = self.runs.get(run_id)
        if run is not None:
            run.status, run.error = status, error
            if written is not None:
                run.unwritten = {n["id"] for n in run.graph["nodes"] if n["kind"] == "output"
                                 and n["id"] not in run.states and n["id"].removeprefix("out:") not in written}
            run.finished = time.time() if now is None else now
            self._unkey(run_id)  # its counts stay; which key is whose is not needed any more (a batch holds many)

    # -- fed by the scheduler --------------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[tuple[Hashable, Iterable[Hashable]]]) -> None:
        """Tasks of a new graph, each with its dependencies' keys: a task of a published layer counts
        for its step; one of a layer Dask renamed, for the step of its dependencies."""
        pending = [(key, list(deps)) for key, deps in tasks]
        for _ in range(9):
            left = []
            for key, deps in pending:
                where = self._layers.get(layer_of(key))
                where = where or next((self._keys[d] for d in deps if d in self._keys), None)
                if where is None:
                    left.append((key, deps))
                else:
                    self._assign(key, where)
            if not left or len(left) == len(pending):
                break
            pending = left

    def _assign(self, key: Hashable, where: tuple[str, str]) -> None:
        old = self._keys.get(key)
        if old == where:
            return
        if old is not None and old[0] in self.runs:
            self.runs[old[0]].steps[old[1]].total -= 1
        run = self.runs.get(where[0])
        if run is not None:
            self._keys[key] = where
            run.steps[where[1]].total += 1

    def transition(self, key: Hashable, start: str, finish: str, nbytes: int | None = None,
                   seconds: float = 0.0, error: str | None = None) -> None:
        """A task changed state on the scheduler."""
        where = self._keys.get(key)
        if where is None or where[0] not in self.runs:
            return
        step = self.runs[where[0]].steps[where[1]]
        if start == "processing":
            step.processing = max(step.processing - 1, 0)
        if finish == "processing":
            step.processing += 1
        elif finish == "memory" and start == "processing" and key not in step.done:
            step.done.add(key)
            step.nbytes += int(nbytes or 0)
            step.seconds += float(seconds or 0.0)
        elif finish == "erred" and start == "processing":
            step.erred += 1
            step.error = step.error or error

    def sample(self, workers: dict[str, dict[str, Any]], now: float | None = None) -> None:
        """Each worker's memory now: ``{worker: {"device_bytes", "host_bytes", "disk_bytes",
        "<move>_bytes", "<move>_seconds", "gpu_memory_used", "process"}}`` (absent keys count 0)."""
        now = time.time() if now is None else now
        self._series.append((now, {w: dict(m) for w, m in workers.items()}))
        for run in self.runs.values():
            if run.status != "running":
                continue
            for w, m in workers.items():
                peak = run.peak.setdefault(w, {"store": 0, "process": 0})
                peak["store"] = max(peak["store"], sum(int(m.get(f"{t}_bytes") or 0) for t in TIERS))
                peak["process"] = max(peak["process"], int(m.get("process") or 0))

    # -- read by the page ------------------------------------------------------------------------------
    @staticmethod
    def _needs(run: _Run) -> dict[str, list[str]]:
        """Whose state each node's state follows: an included pipeline its steps'; a step without
        tasks of its own (Dask's optimizer merged them into the steps or the writes it feeds) those
        steps' and writes'; an output without tasks its source's."""
        children, feeds, source = defaultdict(list), defaultdict(list), defaultdict(list)
        for n in run.graph["nodes"]:
            if n.get("parent"):
                children[n["parent"]].append(n["id"])
        for src, dst, kind in run.graph["edges"]:
            if kind == "data":
                feeds[src].append(dst)
            elif kind == "output":
                source[dst].append(src)
                # an output known up to date: what feeds only it is too; one with tasks (a write the
                # step's chunks were fused into) ran them (never followed back: it follows no one)
                if dst in run.states or run.steps[dst].total:
                    feeds[src].append(dst)
        needs = {}
        for n in run.graph["nodes"]:
            nid, step = n["id"], run.steps[n["id"]]
            if nid in run.states or n.get("fused_into"):
                needs[nid] = []
            elif nid in children:
                needs[nid] = children[nid]
            else:
                needs[nid] = feeds[nid] or source[nid] if not step.total and not step.erred else []
        return needs

    def _states(self, run: _Run) -> dict[str, str]:
        """Every node's state, each after the states it follows (no recursion: chains can be long)."""
        needs = self._needs(run)
        nodes = {n["id"]: n for n in run.graph["nodes"]}
        states: dict[str, str] = {}
        for nid in TopologicalSorter(needs).static_order():
            states[nid] = self._state(run, nodes[nid], {states[d] for d in needs[nid]})
        # after the steps followed what their tasks did: an output not moved into place is not shown done
        return {nid: "not-written" if nid in run.unwritten and s != "failed" else s for nid, s in states.items()}

    def _state(self, run: _Run, node: dict, followed: set[str]) -> str:
        nid = node["id"]
        if nid in run.states:
            return run.states[nid]
        if node.get("fused_into"):
            return "fused"
        s = run.steps[nid]
        if s.erred or "failed" in followed:
            return "failed"
        ended = run.status != "running"  # what has not run by then never will: the run cancelled it
        if s.total:
            if len(s.done) >= s.total or run.status == "ok":  # ok: a task not seen ending ran before (shared)
                return "done"
            if ended:
                return "cancelled"
            return "running" if s.done or s.processing else "waiting"
        followed = followed - {"fused"}
        if not followed:
            return "done" if run.status == "ok" else "cancelled" if ended else "waiting"
        if followed == {"up-to-date"}:
            return "up-to-date"  # it feeds only outputs that were not computed again
        if followed <= {"done", "up-to-date"}:
            return "done"
        if ended:
            return "cancelled"
        return "waiting" if followed <= {"waiting"} else "running"

    def view(self, run_id: str | None = None) -> dict[str, Any]:
        """Plain data of the run ``run_id`` (default: the latest), its batch, and memory."""
        run = self.runs.get(run_id) if run_id else (self.runs[next(reversed(self.runs))] if self.runs else None)
        out: dict[str, Any] = {"run": None, "graph": None, "steps": [], "items": [], "memory": self._memory(run)}
        if run is None:
            return out
        out["run"] = {**self._row(run), "batch": run.batch, "peak": run.peak}
        out["graph"] = run.graph
        states = self._states(run)
        for node in run.graph["nodes"]:
            s = run.steps[node["id"]]
            out["steps"].append({"id": node["id"], "label": node["label"], "kind": node["kind"],
                                 "what": node["what"], "state": states[node["id"]],
                                 "done": len(s.done), "erred": s.erred, "total": s.total, "bytes": s.nbytes,
                                 "seconds": s.seconds, "error": s.error})
        same = [r for r in self.runs.values() if r.batch is not None and r.batch == run.batch] or [run]
        out["items"] = [{**self._row(r), "done": sum(len(s.done) for s in r.steps.values()),
                         "total": sum(s.total for s in r.steps.values())} for r in same]
        return out

    @staticmethod
    def _row(run: _Run) -> dict[str, Any]:
        return {"id": run.id, "name": run.name, "item": run.item, "status": run.status, "error": run.error,
                "seconds": (run.finished or time.time()) - run.started}

    def _memory(self, run: _Run | None) -> dict[str, Any]:
        """Bytes per tier summed over workers over time, the moves between tiers as GB/s, and each
        worker's latest figures (bytes per tier, bytes moved and the speed of its moves)."""
        samples = list(self._series)
        if run is not None:
            samples = [s for s in samples if s[0] >= run.started - 5]
        series: dict[str, list] = {"t": [], **{t: [] for t in TIERS}, "gbps": []}
        prev = None
        for t, workers in samples:
            series["t"].append(t)
            for tier in TIERS:
                series[tier].append(sum(int(m.get(f"{tier}_bytes") or 0) for m in workers.values()))
            moved = sum(int(m.get(f"{a}_bytes") or 0) for m in workers.values() for a in MOVES)
            series["gbps"].append(0.0 if prev is None or t <= prev[0] else max(moved - prev[1], 0) / (t - prev[0]) / 1e9)
            prev = (t, moved)
        latest = samples[-1][1] if samples else {}
        rows = []
        for w, m in sorted(latest.items()):
            moves = {}
            for a in MOVES:
                b, s = int(m.get(f"{a}_bytes") or 0), float(m.get(f"{a}_seconds") or 0.0)
                if b:
                    moves[a] = {"bytes": b, "gbps": b / s / 1e9 if s > 0 else None}
            rows.append({"worker": w, **{t: int(m.get(f"{t}_bytes") or 0) for t in TIERS}, "moves": moves,
                         "gpu_memory": m.get("gpu_memory_used"), "process": m.get("process")})
        return {"series": series, "workers": rows}
