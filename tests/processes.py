"""Processes of the test clusters (tests/test_ray.py's Ray, tests/slurm_cluster.py's SLURM):
started for a module and stopped whatever happened, none left. Imports nothing of the harness."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any


def kill_until_none(alive: Callable[[], list[int]], seconds: float = 30.0) -> None:
    """SIGKILL every pid ``alive()`` lists, again until it lists none (a cluster's daemon may
    start a process between a listing and its kill), for ``seconds`` at most."""
    deadline = time.monotonic() + seconds
    while (pids := alive()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


@contextlib.contextmanager
def started_cluster(cluster: Any) -> Iterator[Any]:
    """A test cluster (tests/test_ray.py's, tests/slurm_cluster.py's) started, and stopped at the
    end whatever happened, with none of its processes left."""
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.processes()
