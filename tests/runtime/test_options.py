"""Bad session options fail with one clear message before any cluster starts."""

from __future__ import annotations

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
    assert parse_memory(text, "memory_limit") == expected


def test_cpu_backend_on_any_machine():
    o = resolve(backend="cpu", gpus=[7], memory_limit="1GiB")
    assert o.backend == "cpu" and o.memory_limit == 1 << 30


def test_visible_devices_parsing(monkeypatch):
    assert backend._parse_visible("0,1,2") == ["0", "1", "2"]
    assert backend._parse_visible("1,-1,2") == ["1"]
    assert backend._parse_visible("") == []
    assert backend._parse_visible("GPU-abc,3") == ["GPU-abc", "3"]
