"""Bad session options fail with one clear message before any cluster starts."""

from __future__ import annotations

import dask
import pytest

from flowgpu import Session, backend
from flowgpu.errors import BackendError, ConfigError, FlowgpuError, MemoryLimitError
from flowgpu.runtime.options import parse_memory, resolve


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(backend="tpu"), ConfigError, ["unknown backend 'tpu'", "auto, gpu, cpu"]),
        (dict(backend="cpu", memory_limit="-3GB"), ConfigError, ["memory_limit", "negative"]),
        (dict(backend="cpu", memory_limit="lots"), ConfigError, ["memory_limit='lots'", "4GiB"]),
        (dict(backend="cpu", memory_limit=-1), ConfigError, ["negative"]),
        (dict(backend="cpu", memory_limit=1 << 60), MemoryLimitError, ["larger than this machine"]),
        (dict(backend="cpu", n_workers=0), ConfigError, ["n_workers=0"]),
        (dict(backend="cpu", threads_per_worker="two"), ConfigError, ["threads_per_worker"]),
        (dict(backend="cpu", connect_timeout="soon"), ConfigError, ["connect_timeout"]),
        (dict(gpus="a,b"), ConfigError, ["gpus="]),
        (dict(gpus=[0, 0]), ConfigError, ["distinct"]),
        (dict(gpus=[0, -1]), ConfigError, ["gpus=[0, -1] has -1 at position 1", "GPU ordinal"]),
        (dict(backend="cpu", n_workers=True), ConfigError, ["n_workers=True", "whole number >= 1"]),
        (dict(backend="cpu", device_memory_limit="lots"), ConfigError, ["device_memory_limit='lots'", "'default'"]),
        (dict(backend="cpu", connect_timeout="-2s"), ConfigError, ["connect_timeout='-2s' is negative"]),
        (dict(backend="cpu", batch_interval="5s"), ConfigError, ["batch_interval='5s' is longer than 1s"]),
        (dict(address=""), ConfigError, ["address='' is empty", "tcp://host:port"]),
        # a float above 1 is bytes (distributed's rule): 2.0 is 2 bytes, which killed every worker after 5 s
        (dict(backend="cpu", memory_limit=2.0), MemoryLimitError, ["memory_limit=2.0 is 2 bytes per worker", "'4GiB'"]),
        (dict(backend="cpu", rmm_pool_size="1MB"), MemoryLimitError, ["rmm_pool_size='1MB' is 1000000 bytes"]),
    ],
)
def test_bad_options_are_refused_before_starting(kwargs, error, words):
    with pytest.raises(error) as info:
        resolve(**kwargs)
    msg = str(info.value)
    assert isinstance(info.value, FlowgpuError) and "\n" not in msg
    for w in words:
        assert w in msg


@pytest.mark.skipif(backend.has_gpu(), reason="checks the machine without a GPU")
def test_gpu_backend_without_gpu_fails_clearly():
    with pytest.raises(BackendError, match="no GPU is visible"):
        Session(backend="gpu")


@pytest.mark.skipif(backend.has_gpu(), reason="checks the machine without a GPU")
def test_gpus_naming_missing_devices():
    with pytest.raises(ConfigError, match=r"gpus=\[3\].*not visible"):
        resolve(gpus=[3])


def test_missing_scheduler_file():
    with pytest.raises(ConfigError, match="scheduler file 'nope.json' does not exist"):
        resolve("nope.json")


@pytest.mark.parametrize("text, expected", [("4GiB", 4 << 30), ("512MB", 512_000_000), (0.5, 0.5),
                                            ("auto", "auto"), (1000, 1000), ("0.25", 0.25)])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


def test_cpu_backend_on_any_machine():
    o = resolve(backend="cpu", gpus=[7], memory_limit="1GiB")
    assert o.backend == "cpu" and o.memory_limit == 1 << 30


def test_visible_devices_parsing(monkeypatch):
    assert backend._parse_visible("0,1,2") == ["0", "1", "2"]
    assert backend._parse_visible("1,-1,2") == ["1"]
    assert backend._parse_visible("") == []
    assert backend._parse_visible("GPU-abc,3") == ["GPU-abc", "3"]


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"flowgpu.n-workers": 0}, ["flowgpu.n-workers=0 is below 1"]),
        ({"flowgpu.memory-limit": "lots"}, ["flowgpu.memory-limit='lots' is not a memory size", "4GiB"]),
        ({"flowgpu.batch-interval": 2}, ["flowgpu.batch-interval=2 is above 1", "None"]),
        ({"flowgpu.spill.store": "zict"}, ["unknown flowgpu.spill.store 'zict'", "flowgpu, dask-cuda, dask"]),
        ({"flowgpu.spill.host-fraction": 1.5}, ["flowgpu.spill.host-fraction=1.5", "<= 1"]),
        ({"flowgpu.chunks.headrom": 3}, ["unknown option flowgpu.chunks.headrom", "did you mean flowgpu.chunks.headroom"]),
    ],
)
def test_bad_config_is_named_as_configured(settings, words):
    with dask.config.set(settings), pytest.raises(ConfigError) as info:
        resolve(backend="cpu")
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_a_keyword_argument_shadows_a_bad_config_value():
    with dask.config.set({"flowgpu.n-workers": 0, "flowgpu.memory-limit": "lots"}):
        o = resolve(backend="cpu", n_workers=2, memory_limit="512MiB")
    assert (o.n_workers, o.memory_limit) == (2, 512 << 20)


def test_options_are_converted_and_other_keywords_go_to_the_cluster():
    with dask.config.set({"flowgpu.batch-interval": "5ms"}):
        o = resolve(backend="cpu", connect_timeout="2m", memory_limit="0.25", processes=False,
                    dashboard_address=None)
    assert o.connect_timeout == 120.0 and o.batch_interval == 0.005 and o.memory_limit == 0.25
    assert o.dashboard_address is None and o.extra == {"processes": False}
    assert resolve(backend="cpu").dashboard_address == dask.config.get("flowgpu.dashboard-address")


@pytest.mark.parametrize("typo, meant", [("nworkers", "n_workers"), ("threads_per_workr", "threads_per_worker"),
                                         ("memory_limt", "memory_limit")])
def test_a_misspelt_keyword_is_named_before_any_worker_starts(typo, meant):
    """An unknown keyword went on to every nanny, which failed: 'RuntimeError: Nanny failed to start'."""
    import flowgpu as fg

    with pytest.raises(ConfigError, match=rf"Session got an unknown keyword '{typo}'; did you mean '{meant}'\?"):
        fg.Session(backend="cpu", n_workers=1, dashboard_address=None, **{typo: 2})
