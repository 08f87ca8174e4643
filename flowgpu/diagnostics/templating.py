"""The diagnostics' HTML and SVG templates (``templates/``), rendered by Jinja2 with autoescaping on:
step names, paths and error text come from users; only markup we made is passed as :class:`Markup`."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, Undefined
from markupsafe import Markup

from flowgpu.diagnostics.report import format_bytes

__all__ = ["Markup", "macros", "render"]

_ENV = Environment(loader=PackageLoader("flowgpu.diagnostics"), autoescape=True, trim_blocks=True,
                   lstrip_blocks=True, finalize=lambda v: "" if v is None else v)  # None shows as nothing
_ENV.filters["bytes"] = lambda n: format_bytes(None if isinstance(n, Undefined) else n)  # a missing count: "?"


def render(template: str, **context: Any) -> str:
    """The text of ``templates/<template>`` with ``context``."""
    return _ENV.get_template(template).render(**context)


def macros(template: str) -> Any:
    """The macros of ``templates/<template>`` as attributes (each returns :class:`Markup`)."""
    return _ENV.get_template(template).module
