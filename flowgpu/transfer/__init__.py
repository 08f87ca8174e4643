"""How bytes move between host and device: pinned host buffers placed on the GPU's NUMA node
(:mod:`~flowgpu.transfer.pinned`), host blocks and file rows staged through them
(:mod:`~flowgpu.transfer.staging`), copies on their own CUDA streams (:mod:`~flowgpu.transfer.streams`).
Never imports the worker store, the runtime, or CuPy at import time.
"""
