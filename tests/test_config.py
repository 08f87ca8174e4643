"""flowgpu.yaml and flowgpu-schema.yaml stay in step; config reaches dask.config and env variables."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from flowgpu import config


def _check(defaults, schema, path):
    assert schema.get("type") == "object" or "properties" in schema, path
    props = schema["properties"]
    assert set(defaults) == set(props), f"{path}: yaml keys {sorted(defaults)} vs schema {sorted(props)}"
    for key, value in defaults.items():
        if isinstance(value, dict):
            _check(value, props[key], f"{path}.{key}")
        else:
            assert "description" in props[key], f"{path}.{key} has no description in the schema"


def test_schema_is_complete():
    with open(config.DEFAULTS_PATH) as f:
        defaults = yaml.safe_load(f)
    with open(config.SCHEMA_PATH) as f:
        schema = yaml.safe_load(f)
    _check(defaults["flowgpu"], schema["properties"]["flowgpu"], "flowgpu")


def test_defaults_validate_against_schema():
    jsonschema = __import__("pytest").importorskip("jsonschema")
    with open(config.DEFAULTS_PATH) as f:
        defaults = yaml.safe_load(f)
    with open(config.SCHEMA_PATH) as f:
        schema = yaml.safe_load(f)
    jsonschema.validate(defaults, schema)


def test_environment_variable_overrides_default():
    code = "import flowgpu.config as c; print(c.get('backend'), c.get('chunks.headroom'))"
    env = dict(os.environ, DASK_FLOWGPU__BACKEND="cpu", DASK_FLOWGPU__CHUNKS__HEADROOM="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "3"]


def test_argument_overrides_config():
    import dask

    with dask.config.set({"flowgpu.backend": "gpu"}):
        assert config.get("backend") == "gpu"
        assert config.get("backend", "cpu") == "cpu"


def test_import_is_light():
    code = "import sys, flowgpu; print(sorted(m for m in ('cupy', 'dask_cuda', 'rmm', 'distributed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_config_survives_a_set_block_entered_before_import():
    code = (
        "import dask\n"
        "with dask.config.set({'flowgpu.chunks.headroom': 5}):\n"
        "    import flowgpu.config as c\n"
        "    inside = c.get('chunks.headroom')\n"
        "print(inside, c.get('chunks.headroom'), c.get('backend'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import flowgpu

    with open(os.path.join(os.path.dirname(flowgpu.__file__), "flowgpu.yaml")) as f:
        default = yaml.safe_load(f)["flowgpu"]["chunks"]["headroom"]
    assert default != 5
    assert out.stdout.split() == ["5", str(default), "auto"]


def _leaves(schema, path=""):
    for key, sub in schema["properties"].items():
        if sub.get("type") == "object":
            yield from _leaves(sub, f"{path}{key}.")
        else:
            yield path + key, sub


def test_every_option_says_what_it_allows():
    config.check(config.tree())  # the defaults pass
    for key, sub in _leaves(config.SCHEMA):
        words = config.allowed(sub)
        assert words and "\n" not in words, key


def test_a_bad_environment_variable_is_named_before_any_cluster_starts():
    code = "from flowgpu.runtime import resolve\nresolve(backend='cpu')\n"
    env = dict(os.environ, DASK_FLOWGPU__CHUNKS__HEADROOM="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "flowgpu.errors.ConfigError: flowgpu.chunks.headroom=0 is below 1; give a whole number >= 1")


def test_a_users_yaml_may_spell_options_with_underscores(tmp_path):
    (tmp_path / "flowgpu.yaml").write_text("flowgpu:\n  n_workers: 3\n  chunks:\n    cpu_target: 64MiB\n")
    code = ("from flowgpu.runtime import resolve\nfrom flowgpu import config\n"
            "print(resolve(backend='cpu').n_workers, config.get('chunks.cpu-target'))\n")
    env = dict(os.environ, DASK_CONFIG=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "64MiB"]
