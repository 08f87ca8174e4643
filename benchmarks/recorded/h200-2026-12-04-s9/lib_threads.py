"""Other CUDA libraries called in new threads, one after another (the rfft2 failure's pattern)."""
import threading
import numpy as np
import cupy as cp

CALLS = {
    "matmul": lambda g: g @ g.T,
    "qr": lambda g: cp.linalg.qr(g)[1],
    "svd": lambda g: cp.linalg.svd(g, compute_uv=False),
    "solve": lambda g: cp.linalg.solve(g @ g.T + 8 * cp.eye(8), cp.ones(8)),
    "rfft": lambda g: cp.fft.rfft(g, axis=1),
    "rfftn": lambda g: cp.fft.rfftn(g),
    "irfft2": lambda g: cp.fft.irfft2(cp.fft.rfft2(g)),
    "cumsum": lambda g: cp.cumsum(g, axis=0),
    "sort": lambda g: cp.sort(g, axis=None),
}
REF = {"matmul": lambda a: a @ a.T, "qr": lambda a: None, "svd": lambda a: np.linalg.svd(a, compute_uv=False),
       "solve": lambda a: np.linalg.solve(a @ a.T + 8 * np.eye(8), np.ones(8)), "rfft": lambda a: np.fft.rfft(a, axis=1),
       "rfftn": np.fft.rfftn, "irfft2": lambda a: np.fft.irfft2(np.fft.rfft2(a)), "cumsum": lambda a: np.cumsum(a, axis=0),
       "sort": lambda a: np.sort(a, axis=None)}

for name, call in CALLS.items():
    said = []
    for k in range(3):
        a = np.random.default_rng().normal(size=(8, 8))
        g = cp.asarray(np.concatenate([a, a]))[8:]  # a view
        box = {}
        def one():
            try:
                box["out"] = call(g)
            except Exception as e:
                box["err"] = f"{type(e).__name__}: {e}"
        t = threading.Thread(target=one); t.start(); t.join()
        if "err" in box:
            said.append(f"#{k} {box['err']}")
        else:
            ref = REF[name](a)
            ok = ref is None or np.allclose(box["out"].get(), ref)
            said.append(f"#{k} ok" if ok else f"#{k} WRONG")
    print(f"{name}: {'; '.join(said)}", flush=True)
