"""The diagnostics' HTML and SVG templates (``templates/``), rendered by Jinja2 with autoescaping on:
step names, paths and error text come from users; only markup we made is passed as ``Markup``."""

from jinja2 import Environment, PackageLoader, Undefined

from flowgpu.diagnostics.report import format_bytes

ENV = Environment(loader=PackageLoader("flowgpu.diagnostics"), autoescape=True, trim_blocks=True,
                  lstrip_blocks=True, finalize=lambda v: "" if v is None else v)  # None shows as nothing
ENV.filters["bytes"] = lambda n: format_bytes(None if isinstance(n, Undefined) else n)  # a missing count: "?"
