"""flowgpu's defaults, in dask.config under the ``flowgpu`` namespace.

``flowgpu/flowgpu.yaml`` holds the defaults and ``flowgpu/flowgpu-schema.yaml`` describes them;
both are loaded into :mod:`dask.config`, so ``DASK_FLOWGPU__BACKEND=cpu`` and
``~/.config/dask/flowgpu.yaml`` work as users of Dask expect.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_HERE = os.path.dirname(__file__)
DEFAULTS_PATH = os.path.join(_HERE, "flowgpu.yaml")
SCHEMA_PATH = os.path.join(_HERE, "flowgpu-schema.yaml")

_NO_DEFAULT = object()


def _load_defaults() -> dict:
    with open(DEFAULTS_PATH) as f:
        defaults = yaml.safe_load(f)
    dask.config.update_defaults(defaults)
    return defaults


DEFAULTS = _load_defaults()


def get(key: str, override_with: Any = None, default: Any = _NO_DEFAULT) -> Any:
    """Read ``flowgpu.<key>`` from dask.config, unless ``override_with`` is given (not None)."""
    full = key if key.startswith("flowgpu.") else f"flowgpu.{key}"
    if default is not _NO_DEFAULT:
        return dask.config.get(full, default=default, override_with=override_with)
    try:
        return dask.config.get(full, override_with=override_with)
    except KeyError:
        # A dask.config.set({"flowgpu.x": ...}) block entered before this module was imported drops
        # the whole namespace when it exits; put the defaults back under whatever is set now.
        dask.config.update(dask.config.config, DEFAULTS, priority="old")
        return dask.config.get(full, override_with=override_with)
