"""Recipes: digests that change with exactly what changes an output, and file fingerprints."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import dask
import dask.array as da
import numpy as np
import pytest

import tests.pipeline.helpers  # noqa: F401  (registers the test ops)
from flowgpu import pipeline
from flowgpu.ops import registry
from flowgpu.pipeline import recipe as recipe_module
from flowgpu.pipeline.recipe import fingerprint, recipes, same_fingerprint

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def two_branches(tmp_path) -> dict:
    """Branch a reads a.npy (outputs a_file, a_sum); branch b is synthetic (output b_sum)."""
    return {
        "name": "two-branches",
        "params": {"k": 0.5, "seed": 3, "out": str(tmp_path / "out")},
        "inputs": {
            "xa": {"source": "npy", "path": str(tmp_path / "a.npy"), "chunks": "auto"},
            "xb": {"source": "random", "shape": [1024, 512], "seed": "${params.seed}", "chunks": "auto"},
        },
        "steps": {
            "ca": {"op": "subtract", "inputs": ["xa"], "args": {"b": "${params.k}"}},
            "sa": {"op": "square", "inputs": ["ca"]},
            "ta": {"op": "sum", "inputs": ["sa"], "args": {"axis": 0}},
            "cb": {"op": "multiply", "inputs": ["xb"], "args": {"b": 2.0}},
            "tb": {"op": "sum", "inputs": ["cb"]},
        },
        "outputs": {
            "a_file": {"from": "sa", "sink": "npy", "path": "${params.out}/a.npy"},
            "a_sum": {"from": "ta"},
            "b_sum": {"from": "tb"},
        },
    }


@pytest.fixture
def spec(tmp_path, rng):
    np.save(tmp_path / "a.npy", rng.standard_normal((30, 4)))
    return two_branches(tmp_path)


def digests(spec, **kw) -> dict[str, str]:
    return {k: r.digest for k, r in recipes(pipeline.compile(spec, **kw)).items()}


def test_recipe_names_params_inputs_and_nothing_else(spec, tmp_path):
    got = recipes(pipeline.compile(spec))
    assert got["a_file"].params == {"k": 0.5, "out": str(tmp_path / "out")}
    assert got["a_sum"].params == {"k": 0.5}
    assert got["b_sum"].params == {"seed": 3}
    assert list(got["a_file"].inputs) == [str(tmp_path / "a.npy")] and got["b_sum"].inputs == {}
    assert got["a_sum"].inputs[str(tmp_path / "a.npy")] == fingerprint(str(tmp_path / "a.npy"))
    assert len({r.digest for r in got.values()}) == 3 and all(len(r.digest) == 32 for r in got.values())
    assert all(r.code == {} for r in got.values())  # flowgpu's own ops are covered by its version


def test_digest_ignores_fusion_dict_order_and_the_order_of_steps(spec):
    fused = pipeline.compile(spec)
    assert fused.fused  # subtract + square is fused: the test compares a fused and an unfused plan
    base = {k: r.digest for k, r in recipes(fused).items()}
    with dask.config.set({"flowgpu.fuse-ufuncs": False}):
        assert not pipeline.compile(spec).fused and digests(spec) == base
    shuffled = copy.deepcopy(spec)
    for section in ("inputs", "steps", "outputs"):
        shuffled[section] = dict(reversed(list(shuffled[section].items())))
    shuffled["inputs"]["xb"] = dict(reversed(list(shuffled["inputs"]["xb"].items())))
    assert list(shuffled["steps"]) != list(spec["steps"])
    assert digests(shuffled) == base


def test_digest_is_the_same_in_another_process_whatever_chunks_auto_resolves_to(spec, tmp_path):
    plan = pipeline.compile(spec)
    base = {k: r.digest for k, r in recipes(plan).items()}
    code = textwrap.dedent("""
        import json, sys
        from flowgpu import pipeline
        from flowgpu.pipeline.recipe import recipes
        plan = pipeline.compile(json.loads(sys.argv[1]))
        print(json.dumps({"chunks": plan.arrays["xb"].chunks, "digests":
                          {k: r.digest for k, r in recipes(plan).items()}}))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONHASHSEED="12345", DASK_FLOWGPU__CHUNKS__CPU_TARGET="1MiB")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env, capture_output=True, text=True,
                         check=True, timeout=90, cwd=tmp_path)
    other = json.loads(out.stdout)
    assert [list(c) for c in plan.arrays["xb"].chunks] != other["chunks"]  # chunks: auto resolved differently
    assert other["digests"] == base


def _changed(spec, edit) -> set[str]:
    before = digests(spec)
    edited = copy.deepcopy(spec)
    edit(edited)
    after = digests(edited)
    return {k for k in before if before[k] != after[k]}


@pytest.mark.parametrize("edit, affected", [
    (lambda s: s["steps"]["cb"]["args"].update(b=3.0), {"b_sum"}),
    (lambda s: s["params"].update(k=0.25), {"a_file", "a_sum"}),
    (lambda s: s["params"].update(seed=4), {"b_sum"}),
    (lambda s: s["steps"]["sa"].update(op="abs"), {"a_file", "a_sum"}),
    (lambda s: s["steps"]["ta"]["args"].update(axis=1), {"a_sum"}),
    (lambda s: s["outputs"]["a_file"].update(path="${params.out}/other.npy"), {"a_file"}),
    (lambda s: s["outputs"]["a_file"].update(sink="zarr", path="${params.out}/a.zarr"), {"a_file"}),
    (lambda s: s["inputs"]["xb"].update(chunks=[256, 512]), {"b_sum"}),  # given chunks: random numbers differ
    (lambda s: s["steps"]["cb"].update(description="twice"), set()),
    (lambda s: s["steps"]["ta"].update(expect={"dtype": "float64"}), set()),
    (lambda s: s["steps"].update(extra={"op": "negative", "inputs": ["xb"]}), set()),
])
def test_a_change_changes_the_digest_of_exactly_the_outputs_downstream(spec, edit, affected):
    assert _changed(spec, edit) == affected


def test_a_param_override_changes_the_digest_and_is_recorded(spec):
    plain = recipes(pipeline.compile(spec))
    other = recipes(pipeline.compile(spec, params={"k": 2.0}))
    assert other["a_sum"].params == {"k": 2.0} and other["a_sum"].digest != plain["a_sum"].digest
    assert other["b_sum"] == plain["b_sum"]


def test_user_function_code_is_in_the_digest(tmp_path, monkeypatch, rng):
    module = f"userfn_{uuid.uuid4().hex[:8]}"
    source = tmp_path / f"{module}.py"
    source.write_text("def f(block):\n    return block * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {
        "inputs": {"x": {"source": "random", "shape": [20], "seed": 1},
                   "y": {"source": "python", "callable": "tests.pipeline.helpers:make_matrix",
                         "args": {"rows": 4, "cols": 3}, "shape": [4, 3], "dtype": "float64"}},
        "steps": {"m": {"op": "map_blocks", "inputs": ["x"], "args": {"function": f"{module}:f"}},
                  "c": {"op": "test_counted", "inputs": ["y"]}},
        "outputs": {"m": {"from": "m"}, "c": {"from": "c"}},
    }
    plan = pipeline.compile(spec)
    before = recipes(plan)
    assert list(before["m"].code) == [str(source)]
    helpers = os.path.join(ROOT, "tests", "pipeline", "helpers.py")
    assert list(before["c"].code) == [helpers]  # the python source's callable and the op: one module
    assert {k: r.digest for k, r in recipes(pipeline.compile(spec, for_run=True)).items()} == {
        k: r.digest for k, r in before.items()}  # a run's compile (the source called) hashes the same
    source.write_text("def f(block):\n    return block * 3\n")
    after = recipes(plan)
    assert after["m"].digest != before["m"].digest and after["m"].code != before["m"].code
    assert after["c"] == before["c"]
    monkeypatch.delitem(sys.modules, module)  # not imported: found on sys.path, and not imported again
    assert recipes(plan)["m"] == after["m"] and module not in sys.modules


def test_an_old_module_edited_in_place_is_hashed_again(tmp_path, monkeypatch):
    """A module untouched for a while is read once per process, then known by its stat; editing it
    (same size, same inode, its mtime set back) moves its ctime, so it is read again."""
    module = f"oldfn_{uuid.uuid4().hex[:8]}"
    source = tmp_path / f"{module}.py"
    source.write_text("def f(block):\n    return block * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"inputs": {"x": {"source": "random", "shape": [20], "seed": 1}},
            "steps": {"m": {"op": "map_blocks", "inputs": ["x"], "args": {"function": f"{module}:f"}}},
            "outputs": {"m": {"from": "m"}}}
    plan = pipeline.compile(spec)
    reads = []
    digest = recipe_module.content_digest
    monkeypatch.setattr(recipe_module, "content_digest", lambda path: reads.append(path) or digest(path))
    now = time.time_ns
    monkeypatch.setattr(recipe_module.time, "time_ns", lambda: now() + 10**10)  # the file's last write 10 s ago
    first = recipes(plan)["m"]
    assert recipes(plan)["m"] == first and reads == [str(source)]  # read once, then known by its stat
    written = source.stat().st_mtime_ns
    with open(source, "r+") as f:  # in place: the same inode and size
        f.write("def f(block):\n    return block * 3\n")
    os.utime(source, ns=(written, written))  # and its mtime as it was
    assert recipes(plan)["m"].digest != first.digest and len(reads) == 2


def test_an_op_registered_from_a_user_module_is_hashed_by_its_source(tmp_path, monkeypatch, request):
    module = f"userop_{uuid.uuid4().hex[:8]}"
    source = tmp_path / f"{module}.py"
    text = ("import flowgpu\n\n@flowgpu.op('{name}', kind='elementwise', replace=True)\n"
            "def halve(x):\n    return x * 0.5\n")
    source.write_text(text.format(name=module))
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(module)
    request.addfinalizer(lambda: registry.OPS.remove(module))
    spec = {"inputs": {"x": {"source": "random", "shape": [10], "seed": 2}},
            "steps": {"h": {"op": module, "inputs": ["x"]}, "n": {"op": "negative", "inputs": ["x"]}},
            "outputs": {"h": {"from": "h"}, "n": {"from": "n"}}}
    plan = pipeline.compile(spec)
    before = recipes(plan)
    assert list(before["h"].code) == [str(source)] and before["n"].code == {}
    source.write_text(text.format(name=module).replace("0.5", "0.25"))
    after = recipes(plan)
    assert after["h"].digest != before["h"].digest and after["n"] == before["n"]


def test_uses_steps_bring_their_files_and_steps(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "v.npy", rng.standard_normal(7))
    np.save(tmp_path / "w.npy", rng.standard_normal(7))
    inner = ("params: {k: 1.0}\n"
             "inputs:\n  a: {source: zeros, shape: [7]}\n  w: {source: npy, path: w.npy}\n"
             "steps:\n  scaled: {op: multiply, inputs: [a], args: {b: '${params.k}'}}\n"
             "  shifted: {op: add, inputs: [scaled, w]}\n"
             "outputs:\n  result: {from: shifted}\n  other: {from: w}\n")
    (tmp_path / "inner.yaml").write_text(inner)
    (tmp_path / "outer.yaml").write_text(
        "params: {k: 3.0}\n"
        "inputs:\n  v: {source: npy, path: v.npy}\n"
        "steps:\n  inner: {uses: inner.yaml, inputs: {a: v}, params: {k: '${params.k}'}}\n"
        "  total: {op: sum, inputs: [inner.result]}\n"
        "outputs:\n  total: {from: total}\n  w: {from: inner.other}\n")
    got = recipes(pipeline.compile("outer.yaml"))
    assert sorted(got["total"].inputs) == [str(tmp_path / "v.npy"), str(tmp_path / "w.npy")]
    assert list(got["w"].inputs) == [str(tmp_path / "w.npy")]
    assert got["total"].params == {"k": 3.0}
    changed = recipes(pipeline.compile("outer.yaml", params={"k": 4.0}))
    assert changed["total"].digest != got["total"].digest
    (tmp_path / "inner.yaml").write_text(inner.replace("op: add", "op: subtract"))
    edited = recipes(pipeline.compile("outer.yaml"))
    assert edited["total"].digest != got["total"].digest and edited["w"].digest == got["w"].digest


def test_file_fingerprint_follows_stat_and_content(tmp_path, rng):
    path = str(tmp_path / "x.npy")
    np.save(path, rng.standard_normal(100))
    stat_fp, summed = fingerprint(path), fingerprint(path, checksum=True)
    assert stat_fp["kind"] == "file" and stat_fp["size"] == os.path.getsize(path) and "content" not in stat_fp
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a touch, the same bytes
    assert not same_fingerprint(stat_fp, fingerprint(path))
    assert same_fingerprint(summed, fingerprint(path, checksum=True), checksum=True)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF  # the same size, other bytes
    open(path, "wb").write(bytes(data))
    assert not same_fingerprint(summed, fingerprint(path, checksum=True), checksum=True)
    assert not same_fingerprint(stat_fp, fingerprint(path, checksum=True), checksum=True)  # none recorded


def test_folder_fingerprint_covers_every_file(tmp_path, rng):
    store = str(tmp_path / "x.zarr")
    da.to_zarr(da.from_array(rng.standard_normal((40, 4)), chunks=(10, 4)), store)
    stat_fp, summed = fingerprint(store), fingerprint(store, checksum=True)
    assert stat_fp["kind"] == "dir" and stat_fp["files"] >= 4
    assert fingerprint(store) == stat_fp and fingerprint(store, checksum=True) == summed
    chunk = next(os.path.join(r, f) for r, _, fs in os.walk(store) for f in sorted(fs) if not f.startswith("."))
    st = os.stat(chunk)
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert not same_fingerprint(stat_fp, fingerprint(store))
    assert same_fingerprint(summed, fingerprint(store, checksum=True), checksum=True)
    data = bytearray(open(chunk, "rb").read())
    data[0] ^= 0xFF
    open(chunk, "wb").write(bytes(data))
    assert not same_fingerprint(summed, fingerprint(store, checksum=True), checksum=True)
    open(os.path.join(store, "extra"), "w").close()  # a new, empty file changes the listing
    assert fingerprint(store)["files"] == stat_fp["files"] + 1


def test_a_missing_path_has_a_fingerprint_that_says_so(tmp_path):
    gone = fingerprint(str(tmp_path / "nope.npy"), checksum=True)
    assert gone == {"kind": "missing"}
    assert not same_fingerprint(gone, gone)
    assert fingerprint(str(tmp_path / "nope.npy" / "below"))["kind"] == "missing"
    remote = fingerprint("s3://bucket/x.zarr")
    assert remote == {"kind": "remote"} and not same_fingerprint(remote, remote)


def test_mapping_inputs_count_by_name_and_list_inputs_by_position():
    spec = {"inputs": {"p": {"source": "random", "shape": [8], "seed": 1},
                       "q": {"source": "random", "shape": [8], "seed": 2}},
            "steps": {"d": {"op": "expr", "inputs": {"a": "p", "b": "q"}, "args": {"expression": "a - b"}},
                      "s": {"op": "subtract", "inputs": ["p", "q"]}},
            "outputs": {"d": {"from": "d"}, "s": {"from": "s"}}}
    base = digests(spec)
    reordered = copy.deepcopy(spec)
    reordered["steps"]["d"]["inputs"] = {"b": "q", "a": "p"}
    assert digests(reordered) == base
    swapped = copy.deepcopy(spec)
    swapped["steps"]["d"]["inputs"] = {"a": "q", "b": "p"}
    swapped["steps"]["s"]["inputs"] = ["q", "p"]
    assert all(digests(swapped)[k] != base[k] for k in base)
