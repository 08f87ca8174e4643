"""Which of these makes rfft2 in a second new thread work?"""
import sys, threading
import numpy as np
import cupy as cp

def attempt(label, prep, kind="rfft2", view=True):
    a = np.random.default_rng().normal(size=(3, 8, 6))
    if kind in ("irfft2",):
        a = np.fft.rfft2(a, axes=(1, 2))
    g = cp.asarray(a)
    parts = [g[i:i + 1] for i in range(3)] if view else [cp.asarray(a[i:i + 1]) for i in range(3)]
    errs, outs = [], [None] * 3
    def one(i):
        try:
            prep()
            outs[i] = getattr(cp.fft, kind)(parts[i], axes=(1, 2))
        except Exception as e:
            errs.append(f"{type(e).__name__}: {e}")
    ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    [t.start() for t in ts]; [t.join() for t in ts]
    ok = not errs and np.allclose(np.concatenate([o.get() for o in outs]), getattr(np.fft, kind)(a, axes=(1, 2)))
    print(f"  {label}: ok={ok} {errs[:1]}", flush=True)

def nothing(): pass
def use_device(): cp.cuda.Device(0).use()
def set_device(): cp.cuda.runtime.setDevice(0)
def no_cache(): cp.fft.config.get_plan_cache().set_size(0)
def free0(): cp.cuda.runtime.free(0)

CASES = {"nothing": (nothing, "rfft2", True), "alloc-in-main": (nothing, "rfft2", False),
         "use_device": (use_device, "rfft2", True), "set_device": (set_device, "rfft2", True),
         "cache0": (no_cache, "rfft2", True), "free0": (free0, "rfft2", True),
         "fft2": (nothing, "fft2", True), "irfft2": (nothing, "irfft2", True), "fftn": (nothing, "fftn", True)}

if __name__ == "__main__":
    case = sys.argv[1]
    prep, kind, view = CASES[case]
    print(case, flush=True)
    for k in range(3):
        attempt(f"#{k}", prep, kind, view)
    print("cache:", type(cp.fft.config.get_plan_cache()), flush=True)
