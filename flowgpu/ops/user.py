"""``map_blocks`` with a user function named by import path, and :func:`import_object`, which
resolves such paths (``"package.module:function"`` or ``"package.module.function"``) with errors
that say which part could not be found.

A user function gets one block of each input (NumPy or CuPy, whichever the chunks are) and returns a
block. To work on both, pick the module from the block::

    from flowgpu.backend import array_module

    def soft_threshold(block, t=0.1):
        xp = array_module(block)
        return xp.sign(block) * xp.maximum(xp.abs(block) - t, 0)
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from flowgpu.errors import OpError
from flowgpu.ops._common import Array, DType, defop, dtype_arg, meta_like, same_backend

__all__ = ["map_blocks", "import_object"]


def _split(path: str) -> list[tuple[str, str]]:
    """Candidate (module, attribute path) pairs for ``path``, most specific module first."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return [(module, attr)]
    parts = path.split(".")
    return [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]


def import_object(path: Any, *, what: str = "object", op: str = "map_blocks") -> Any:
    """The object at an import path such as ``"package.module:function"`` or ``"package.module.function"``.

    Raises
    ------
    OpError
        naming the module that could not be imported, or the attribute the module lacks (with close
        matches), and the path as given.

    Examples
    --------
    >>> import_object("numpy:sqrt").__name__
    'sqrt'
    >>> import_object("os.path.join").__name__
    'join'
    """
    if not isinstance(path, str) or not path.strip() or path.count(":") > 1 or (":" not in path and "." not in path):
        raise OpError(f"op {op!r}: {what} {path!r} is not an import path; write 'package.module:{what}' "
                      f"or 'package.module.{what}'")
    path = path.strip()
    candidates = _split(path)
    first_error: str | None = None
    for module_name, attr in candidates:
        if not module_name or not attr:
            raise OpError(f"op {op!r}: {what} {path!r} is not an import path; write 'package.module:{what}'")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            first_error = first_error or f"could not import module {module_name!r} ({e})"
            if e.name is not None and not module_name.startswith(e.name):  # the module exists but fails inside
                raise OpError(f"op {op!r}: importing {module_name!r} for {path!r} failed: {e}") from None
            continue
        except Exception as e:  # the user's module raised while importing
            raise OpError(f"op {op!r}: importing {module_name!r} for {path!r} failed: "
                          f"{type(e).__name__}: {e}") from None
        obj: Any = module
        owner = module_name
        for name in attr.split("."):
            if not hasattr(obj, name):
                close = difflib.get_close_matches(name, [n for n in dir(obj) if not n.startswith("_")], n=3)
                hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
                raise OpError(f"op {op!r}: {what} {path!r} not found: {owner!r} has no attribute {name!r}{hint}")
            obj = getattr(obj, name)
            owner = f"{owner}.{name}"
        return obj
    raise OpError(f"op {op!r}: {what} {path!r} not found: {first_error}; check the spelling and that the "
                  "package is installed in this environment (and on the workers)")


def _axes(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


@defop("map_blocks", kind="user")
def map_blocks(*arrays: Array, function: str, dtype: DType | None = None,
               drop_axis: int | list[int] | None = None, new_axis: int | list[int] | None = None,
               chunks: list | tuple | None = None, kwargs: dict | None = None) -> Array:
    """Apply a user function, given by import path, to every block of the inputs.

    Parameters
    ----------
    *arrays : arrays
        Blocks with the same index are passed together, ``function(block_a, block_b, **kwargs)``;
        inputs should have matching chunks (dask aligns them when they broadcast).
    function : str
        ``"package.module:function"`` or ``"package.module.function"``; it must be importable on the
        workers too. Use ``flowgpu.backend.array_module(block)`` inside it to work on NumPy and CuPy.
    dtype : str, optional
        The dtype of the result; when omitted dask calls the function on an empty block to find it.
    drop_axis, new_axis : int or list of int, optional
        Axes the function removes from, or adds to, each block (as in ``dask.array.map_blocks``).
    chunks : list, optional
        The result's chunks when the function changes block shapes.
    kwargs : mapping, optional
        Keyword arguments passed to the function.

    Returns
    -------
    dask.array.Array
    """
    if not arrays:
        raise OpError("op 'map_blocks': give at least one input array")
    func: Callable = import_object(function, what="function")
    if not callable(func):
        raise OpError(f"op 'map_blocks': {function!r} is a {type(func).__name__}, not a function")
    arrays = tuple(same_backend(*arrays))
    dt = dtype_arg("map_blocks", dtype)
    drop, new = _axes(drop_axis), _axes(new_axis)
    options: dict[str, Any] = {}
    if dt is not None:
        options["meta"] = meta_like(arrays[0], dt, arrays[0].ndim - len(drop) + len(new))
        options["dtype"] = dt
    if chunks is not None:
        options["chunks"] = tuple(tuple(c) if isinstance(c, list) else c for c in chunks)
    try:
        import dask.array as da

        return da.map_blocks(func, *arrays, drop_axis=drop, new_axis=new or None, **options, **(kwargs or {}))
    except (ValueError, TypeError) as e:
        raise OpError(f"op 'map_blocks': applying {function!r}: {e}") from None
