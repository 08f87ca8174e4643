"""A dask worker preload (``dask worker --preload``) that makes flowgpu unimportable in that worker:
a stand-in for a host where flowgpu is not installed."""

import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "flowgpu" or name.startswith("flowgpu."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
for _name in [m for m in sys.modules if m == "flowgpu" or m.startswith("flowgpu.")]:
    del sys.modules[_name]
