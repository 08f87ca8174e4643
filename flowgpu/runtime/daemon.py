"""The standing cluster's process: ``python -m flowgpu.runtime.daemon FOLDER '{"tls": .., "options": ..}'``.

Holds ``FOLDER/cluster.lock`` (a second daemon exits with status 2), opens the Session, records it,
and on SIGTERM/SIGINT/SIGHUP closes it and removes the state. Status 1: the Session did not start
(the log's last ``error:`` line says why).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading

import dask.config

from flowgpu.errors import FlowgpuError
from flowgpu.io import faults
from flowgpu.runtime import standing
from flowgpu.runtime.session import Session


def main(argv: list[str]) -> int:
    folder, given = argv[0], json.loads(argv[1])
    held = os.fdopen(os.open(os.path.join(folder, standing.LOCK), os.O_RDWR | os.O_CREAT, 0o600), "r+")  # held for life
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.close()
        print(f"error: another cluster is starting or running in {folder}; 'flowgpu cluster status' says which",
              flush=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    # each worker exits when this process's end of its pipe closes; forked workers would inherit
    # each other's ends and keep each other alive: spawn them
    dask.config.set({"distributed.worker.multiprocessing-method": "spawn"})
    try:
        security = standing.make_credentials(folder) if given["tls"] else "none"
        session = Session(**given["options"], security=security)
    except FlowgpuError as e:
        standing.forget(folder)
        print(f"error: {e}", flush=True)
        return 1
    try:
        state = standing.describe(session, given, folder)
        standing.record(folder, state)
        print(f"cluster ready at {state['address']}: {state['backend']}, {state['n_workers']} worker(s) "
              f"(pids {', '.join(map(str, state['worker_pids']))}); dashboard: {state['dashboard'] or 'off'}",
              flush=True)
        while not stop.wait(1.0):
            pass
        print("stopping: closing the workers", flush=True)
        faults.point("cluster:stopping")
    finally:
        session.close()
        standing.forget(folder)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
