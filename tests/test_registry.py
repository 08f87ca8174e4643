"""The generic registry and the one import-path resolver."""

from __future__ import annotations

import importlib.metadata

import pytest
from pydantic import ValidationError

from flowgpu import registry
from flowgpu.errors import ConfigError, ImportPathError
from flowgpu.io import sources
from flowgpu.registry import Entry, Registry, import_object, options_model


def _registry(monkeypatch, eps=()):
    monkeypatch.setattr(registry, "_entry_points", lambda group: [e for e in eps if e.group == group])
    return Registry("flowgpu.test", "thing", error=ConfigError,
                    from_plugin=lambda name, obj: Entry(name, obj, obj.__doc__ or ""))


def test_unknown_names_suggest_close_ones(monkeypatch):
    reg = _registry(monkeypatch)
    reg.add(Entry("gaussian", abs))
    reg.add(Entry("uniform", abs))
    with pytest.raises(ConfigError, match="unknown thing 'gausian'; did you mean 'gaussian'"):
        reg.get("gausian")
    with pytest.raises(ConfigError, match="choose one of gaussian, uniform"):
        reg.get("zzz")
    with pytest.raises(ConfigError, match="'uniform' is already registered"):
        reg.add(Entry("uniform", round))
    before = reg.version
    reg.remove("uniform")
    assert reg.names() == ["gaussian"] and reg.version > before


def test_plugins_load_lazily_and_a_broken_one_warns(monkeypatch):
    eps = [importlib.metadata.EntryPoint("good", "os.path:join", "flowgpu.test"),
           importlib.metadata.EntryPoint("bad", "no_such_module_xyz:f", "flowgpu.test")]
    reg = _registry(monkeypatch, eps)
    with pytest.warns(UserWarning, match="could not load thing plugin 'bad'"):
        assert reg.names() == ["good"]
    assert reg.get("good").func.__name__ == "join"


def test_a_plugin_never_takes_a_built_in_name_and_says_so(monkeypatch):
    """An entry point named as a built-in was dropped without a word: a spec using the name got the
    built-in's values where its author expected the plugin's."""
    reg = _registry(monkeypatch, [importlib.metadata.EntryPoint("zeros", "os.path:join", "flowgpu.test")])
    reg.add(Entry("zeros", abs))
    with pytest.warns(UserWarning, match=r"thing plugin 'zeros' \(os.path:join\) is not used: flowgpu already has a "
                                         r"thing 'zeros' \(from builtins\); rename the plugin's entry point") as said:
        assert reg.get("zeros").func is abs
    assert said[0].filename == "entry point zeros = os.path:join"  # named, not a line of flowgpu's code


def _twice():
    def f(x):
        return x
    return f


def test_the_same_definition_registered_again_replaces_it_and_another_is_refused(monkeypatch):
    """A module (or a notebook cell) run again registers a new function object of the same definition."""
    reg = _registry(monkeypatch)
    first, again = _twice(), _twice()
    reg.add(Entry("f", first))
    assert reg.add(Entry("f", again)).func is again
    with pytest.raises(ConfigError, match="thing 'f' is already registered"):
        reg.add(Entry("f", abs))


def test_register_source_refuses_a_built_in_name():
    """It replaced the built-in silently: every `source: npy` input then read the user's function."""
    with pytest.raises(ConfigError, match=r"source 'npy' is already registered \(by flowgpu.io.npy\); pick another "
                                          "name or pass replace=True"):
        sources.register_source("npy", lambda path: None)
    assert sources.source_entry("npy").func is not None and "npy" in sources.source_entry("npy").func.__module__


def test_options_model_from_a_type_hinted_signature():
    def f(n: int, scale: float = 1.0, label="x"):
        """Doc."""

    model = options_model("f", f)
    assert model(n=3).model_dump() == {"n": 3, "scale": 1.0, "label": "x"}
    with pytest.raises(ValidationError, match="n\n  Input should be a valid integer"):
        model(n="three")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model(n=1, other=2)
    assert options_model("g", lambda x, **kw: x, skip=("x",))(anything=1).model_dump() == {"anything": 1}


@pytest.mark.parametrize("path, message", [
    ("no_such_package_xyz.mod:f", "thing 'no_such_package_xyz.mod:f': no module named 'no_such_package_xyz.mod'; "),
    ("os.path:jion", "thing 'os.path:jion': 'os.path' has no attribute 'jion'; did you mean 'join'"),
    ("justaname", "thing 'justaname': is not an import path; write 'package.module:name'"),
    ("a:b:c", "is not an import path"),
    ("os.path:join-x", "is not an import path"),
])
def test_import_object_errors_have_one_style(path, message):
    with pytest.raises(ImportPathError, match=message.replace("(", r"\(")):
        import_object(path, what="thing")
    assert import_object("os.path.join") is import_object("os.path:join")


def test_trusted_modules_refuse_import_paths_outside_them_before_importing(tmp_path, monkeypatch):
    (tmp_path / "noisy_mod_xyz.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.trusted_modules() is None and import_object("os:getcwd")  # the default: anything importable
    with registry.trusting(["numpy", "os.path"]):
        assert registry.trusted_modules() == ["numpy", "os.path"]
        assert import_object("numpy.linalg:norm") and import_object("os.path.join")
        for path in ("noisy_mod_xyz:f", "os:system", "numpyx:f", "os.pathx:f"):
            with pytest.raises(ImportPathError, match=f"'{path}': is outside the trusted modules "
                                                      r"\('numpy', 'os.path'\), so it was not imported"):
                import_object(path, what="callable")
    with registry.trusting([]):  # --trust not given: the setting as it is
        assert registry.trusted_modules() is None


def test_recording_imports_lists_each_path_once():
    with registry.recording_imports() as seen:
        import_object("os.path:join", what="function")
        import_object("os.path:join", what="function")
        import_object("numpy:sqrt", what="callable")
    assert seen == [("function", "os.path:join"), ("callable", "numpy:sqrt")]
    import_object("os:getcwd")
    assert len(seen) == 2
