"""Sweeps on a real Ray cluster of two nodes on this machine (``hydra/launcher=ray``).

The cluster is Ray's own: ``ray start --head`` and a second node that joins it with ``ray
start --address=...``, one CPU and a small object store each, in a private network
namespace made for the test (``unshare --user --map-root-user --net``, only its loopback
up), so that Ray's servers listen on 127.0.0.1 alone and their ports are the test's own.
Every process of the test's cluster lives in that namespace and is killed at the end,
whatever happened. What docs/reliability.md promises for a sweep is checked here on the
cluster: every job's status, the count line, the exit code, ``harness report``, the kernel
cache warm-up, Ctrl-C, and a node stopped while it runs a job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import harness_env, run_harness
from tests.processes import kill_until_none, started_cluster

pytest.importorskip("ray", reason="Ray is installed with the test extra (pip install -e '.[test]')")

RAY = Path(sys.executable).with_name("ray")
HEAD_PORT = 6379
CLIENT_PORT = 10001
OBJECT_STORE = str(80 * 1024 * 1024)
TINY = ["+env=cartpole", "env.horizon=10", "env.world_count=1", "iterations=4", "log_every=2", "plot_every=null"]
RAY_SWEEP = ["hydra/launcher=ray", "hydra.launcher.ray.init.address=auto"]
STARTED = "Ray runtime started"
NODE = ["--num-cpus=1", f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats"]

HOLDER = """
import fcntl, signal, socket, struct
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket() as s:  # the namespace's loopback starts down
    flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
print("ready", flush=True)
signal.pause()
"""


class Cluster:
    """A Ray head and a second node in a network namespace of their own; every command of the
    test that talks to Ray runs in that namespace (``nsenter``)."""

    def __init__(self, root: Path):
        self.root = root
        self.temp = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))  # Ray's socket paths must stay short
        self.holder: subprocess.Popen | None = None
        self.head: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        # RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S: the head's Ray Client proxy gives the server it
        # starts for each client 30 s to come up, which a loaded 2-core machine can miss.
        self.env = harness_env({"RAY_USAGE_STATS_ENABLED": "0", "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "180"})

    @property
    def enter(self) -> list[str]:
        assert self.holder is not None
        return ["nsenter", "--preserve-credentials", "-U", "-n", "-t", str(self.holder.pid)]

    def start(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", HOLDER],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.holder.stdout is not None and self.holder.stdout.readline().strip() == "ready"
        self.namespace = os.readlink(f"/proc/{self.holder.pid}/ns/net")
        head = ["--head", f"--port={HEAD_PORT}", f"--ray-client-server-port={CLIENT_PORT}", f"--temp-dir={self.temp}"]
        self.head = self._node("head", *head, "--include-dashboard=false")
        self.worker = self._worker()  # it waits for the head's control store: both start side by side
        self._wait_started("head", self.head)
        self._wait_started("worker", self.worker)
        self._wait_client_server()

    def _wait_client_server(self) -> None:
        """Ray starts the head's Ray Client server last and does not wait for it: until its port
        takes connections, a ``ray://`` sweep is refused (nothing answers there)."""
        probe = f"import socket; socket.create_connection(('127.0.0.1', {CLIENT_PORT}), timeout=2).close()"
        deadline = time.monotonic() + 120
        while subprocess.run([*self.enter, sys.executable, "-c", probe], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the Ray Client server never took a connection"
            time.sleep(0.5)

    def start_worker(self) -> None:
        self.worker = self._worker()
        self._wait_started("worker", self.worker)

    def _worker(self) -> subprocess.Popen:
        # One log monitor is enough: both nodes write their logs into the head's session folder.
        return self._node("worker", f"--address=127.0.0.1:{HEAD_PORT}", "--include-log-monitor=false")

    def _node(self, name: str, *args: str) -> subprocess.Popen:
        with (self.root / f"{name}.log").open("w") as out:
            return subprocess.Popen(
                [*self.enter, str(RAY), "start", *args, *NODE, "--block"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: stopping the node stops all of it
            )

    def _wait_started(self, name: str, node: subprocess.Popen) -> None:
        log = self.root / f"{name}.log"
        deadline = time.monotonic() + 120
        while STARTED not in log.read_text():
            assert node.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)

    def stop_worker(self) -> None:
        """Stop the second node at once, as a machine that goes down: its raylet and agents."""
        assert self.worker is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait(timeout=30)

    def processes(self) -> list[int]:
        """Every living process in the cluster's network namespace: the nodes, their workers,
        drivers (not a zombie, which is dead and waits only to be reaped)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns" / "net") == self.namespace:
                        state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                        if state != "Z":
                            found.append(int(entry.name))
        return found

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # Ray's own logs stay with the test's other files
            logs = self.temp / "session_latest" / "logs"
            shutil.copytree(logs, self.root / "ray-logs", ignore_dangling_symlinks=True)
        # Again until none is left: a raylet may start a worker between a listing and its kill.
        kill_until_none(self.processes)
        for process in (self.worker, self.head, self.holder):
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)

    def harness(self, *args: str, cwd: Path, env: dict | None = None, timeout: float = 300):
        """``python -m harness ARGS`` in the cluster's namespace, to completion."""
        return subprocess.run(
            [*self.enter, sys.executable, "-m", "harness", *args],
            cwd=cwd,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start_harness(self, *args: str, cwd: Path, out: Path) -> subprocess.Popen:
        """``python -m harness ARGS`` in the namespace, in the background, in a process group of
        its own (as a terminal's foreground job), its output in ``out``."""
        with out.open("w") as log:
            return subprocess.Popen(
                [*self.enter, sys.executable, "-m", "harness", *args],
                cwd=cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def worker_logs(self) -> str:
        """What the jobs' worker processes printed, from the session's log folder."""
        logs = sorted((self.temp / "session_latest" / "logs").glob("worker-*"))
        return "".join(path.read_text(errors="replace") for path in logs)


def _namespaces_work() -> str | None:
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare and nsenter (util-linux) are needed"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no network namespace for the cluster: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _namespaces_work()
    if why is not None:
        pytest.skip(why)
    assert RAY.is_file(), RAY
    with started_cluster(Cluster(tmp_path_factory.mktemp("ray"))) as made:
        yield made


@pytest.fixture
def two_nodes(cluster):
    """The cluster with both nodes (a test may have stopped the second one)."""
    if cluster.worker is None or cluster.worker.poll() is not None:
        cluster.start_worker()
    return cluster


def summaries(sweep: Path) -> dict[str, dict]:
    return {path.parent.name: json.loads(path.read_text()) for path in sweep.glob("*/summary.json")}


def running(sweep: Path) -> list[str]:
    """The job folders whose job has started training (its resolved config is written)."""
    return sorted(path.parent.name for path in sweep.glob("*/config.yaml"))


def checkpointed(sweep: Path) -> set[str]:
    """The job folders that hold a checkpoint."""
    return {path.parent.parent.name for path in sweep.glob("*/checkpoints/*.hckpt")}


def own_lines(out: str) -> list[str]:
    """The launching process's own lines: not those Ray forwards from the jobs and the nodes
    (``(ray_job pid=...)``, ``(raylet)``), which may arrive after them."""
    return [line for line in out.splitlines() if not re.match(r"^(\x1b\[\d+m)?\((ray_job|raylet)", line)]


def jobs_running(cluster: Cluster) -> list[int]:
    """Processes of the cluster that are running a job (Ray names them after the function)."""
    found = []
    for pid in cluster.processes():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::ray_job"):
                found.append(pid)
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


ADDRESS_ERROR = "error: train: hydra.launcher.ray.init.address: "
BAD_ADDRESS_S = 60  # docs/reliability.md: an address where no Ray answers ends within this


def closed_port() -> int:
    """A port nothing listens on (on any address of this machine: Ray connects to 127.0.0.1 as
    to the machine's own address)."""
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def silent_listener():
    """A TCP server on every address of this machine that takes connections and never says a
    word (not Ray); yields its port."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in [*held, server]:
            conn.close()


def sweep_at(address: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float, Path]:
    """A two-job sweep on Ray at ``address`` (no cluster, RAY_ADDRESS unset), its time, its folder."""
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in harness_env().items() if k != "RAY_ADDRESS"}
    start = time.monotonic()
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "harness", "train", "-m", *TINY, "clip.max_norm=1,10", "hydra/launcher=ray"),
            *(f"hydra.launcher.ray.init.address={address}", f"hydra.sweep.dir={sweep}"),
            "hydra.callbacks.warm_kernel_cache.enabled=false",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BAD_ADDRESS_S + 30,  # before the check: Ray retried for many minutes
    )
    return proc, time.monotonic() - start, sweep


def assert_refused_in_one_line(proc, elapsed: float, sweep: Path, start: str) -> str:
    """One line on stderr that starts with ``start``, exit 1 within the time promised, nothing
    but Hydra's multirun.yaml in the sweep folder (no job folder), none of Ray's own lines."""
    out = proc.stdout + proc.stderr
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 1, out
    assert elapsed < BAD_ADDRESS_S, (elapsed, out)
    assert len(lines) == 1, out
    assert lines[0].startswith(start), out
    assert lines[0].endswith(
        "; accepted: the address of a running cluster (auto, HOST:6379, ray://HOST:10001), "
        "or null for a private Ray on this machine"
    ), out
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]
    return lines[0]


def test_an_address_where_nothing_answers_ends_in_one_line(tmp_path):
    port = closed_port()
    proc, elapsed, sweep = sweep_at(f"127.0.0.1:{port}", tmp_path)
    line = assert_refused_in_one_line(proc, elapsed, sweep, f"{ADDRESS_ERROR}nothing answers at '127.0.0.1:{port}' (")
    assert "(tried a TCP connection to the Ray control store" in line
    assert line.split("; accepted:")[0].endswith(" for 10 s: connection refused)")


@pytest.mark.slow  # a second bad address through the command line (the first is in the default suite)
def test_an_address_that_is_not_ray_ends_in_one_line(tmp_path):
    with silent_listener() as port:
        proc, elapsed, sweep = sweep_at(f"127.0.0.1:{port}", tmp_path)
    not_ray = "takes a TCP connection but is not a Ray control store ("
    line = assert_refused_in_one_line(proc, elapsed, sweep, f"{ADDRESS_ERROR}something at '127.0.0.1:{port}' {not_ray}")
    assert "no answer in 15 s" in line


@pytest.mark.slow  # a third bad address through the command line
def test_a_ray_client_address_where_nothing_answers_ends_in_one_line(tmp_path):
    port = closed_port()
    proc, elapsed, sweep = sweep_at(f"ray://127.0.0.1:{port}", tmp_path)
    line = assert_refused_in_one_line(
        proc, elapsed, sweep, f"{ADDRESS_ERROR}nothing answers at 'ray://127.0.0.1:{port}' ("
    )
    assert "(tried a TCP connection to the Ray Client server for 10 s: connection refused)" in line


def test_the_address_check_finds_the_address_as_ray_does(tmp_path, monkeypatch):
    """:func:`harness.sweep.ray_address_problem`: RAY_ADDRESS for null and auto, the cluster
    ``ray start`` recorded for null, none for a private Ray; a port whose connections are
    dropped (a firewall) ends after the TCP connection's time."""
    from harness import sweep
    from harness.sweep import ray_address_problem

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(sweep, "RAY_CONNECT_S", 1.0)  # the TCP connection's time (10 s in a sweep)
    with socket.socket() as full:  # a queue of waiting connections that is full drops the next
        full.bind(("0.0.0.0", 0))
        full.listen(0)
        waiting = [socket.socket() for _ in range(3)]
        for conn in waiting:
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", full.getsockname()[1]))
        start = time.monotonic()
        found = ray_address_problem({"address": f"127.0.0.1:{full.getsockname()[1]}"})
        assert time.monotonic() - start < 5
        for conn in waiting:
            conn.close()
    assert found is not None and found.endswith(" for 1 s: no answer)"), found
    monkeypatch.setattr(sweep, "RAY_CONNECT_S", 0.5)  # a refused connection is tried again that long
    port = closed_port()
    assert ray_address_problem({"address": None, "_temp_dir": str(tmp_path)}) is None  # a private Ray
    (tmp_path / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")  # a cluster stopped by a kill
    found = ray_address_problem({"address": None, "_temp_dir": str(tmp_path)})
    assert found is not None and found.startswith("nothing answers at '"), found
    assert "(the cluster `ray start` recorded on this machine)" in found
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    for address in (None, "auto"):
        found = ray_address_problem({"address": address})
        assert found is not None and found.startswith(f"nothing answers at 'ray://127.0.0.1:{port}' (RAY_ADDRESS)")


def test_a_sweep_on_the_cluster_runs_every_job_counts_them_and_reports_them(two_nodes, tmp_path):
    sweep = tmp_path / "sweep"
    proc = two_nodes.harness(
        "train", "-m", *TINY, *RAY_SWEEP, "clip.max_norm=0.5,-1", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # a job failed
    assert "Connecting to existing Ray cluster at address: 127.0.0.1" in out
    assert "kernel cache warmed in" in out
    assert f"sweep: 2 jobs: 1 finished, 1 failed ({sweep}; python -m harness report {sweep})" in proc.stdout
    assert "Traceback" not in out
    found = summaries(sweep)
    assert found["clip.max_norm=0.5"]["status"] == "finished"
    assert found["clip.max_norm=0.5"]["iterations_done"] == 4
    assert found["clip.max_norm=-1"]["status"] == "failed"
    assert "clip.max_norm" in found["clip.max_norm=-1"]["error"]
    outcomes = {p.parent.parent.name: json.loads(p.read_text())["status"] for p in sweep.rglob("harness_outcome.json")}
    assert outcomes == {"clip.max_norm=0.5": "finished", "clip.max_norm=-1": "failed"}
    report = run_harness("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "jobs: 2 (1 finished, 1 failed)" in report.stdout
    assert (sweep / "report.csv").is_file()


@pytest.mark.slow  # a second sweep on the cluster
def test_a_sweep_through_ray_client_and_a_cold_kernel_cache_compiled_once(two_nodes, tmp_path):
    """``ray://`` (Ray Client, the head's client server); a fresh WARP_CACHE_PATH in the
    launching process reaches the jobs, which only load what the warm-up compiled."""
    cache, sweep = tmp_path / "warp-cache", tmp_path / "sweep"
    proc = two_nodes.harness(
        "train",
        "-m",
        *TINY,
        "hydra/launcher=ray",
        f"hydra.launcher.ray.init.address=ray://127.0.0.1:{CLIENT_PORT}",
        "clip.max_norm=1,2",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        env={"WARP_CACHE_PATH": str(cache), "HARNESS_WARP_LOG_LEVEL": "info"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"sweep: 2 jobs: 2 finished, 0 failed ({sweep}" in proc.stdout
    warm_up = out[: out.index("kernel cache warmed in")]
    assert any("featherstone" in line and "(compiled)" in line for line in warm_up.splitlines())
    jobs = two_nodes.worker_logs().splitlines()
    assert not [line for line in jobs if "(compiled)" in line]
    assert len([line for line in jobs if "featherstone" in line and "(cached)" in line]) >= 2  # once in each job
    assert {s["status"] for s in summaries(sweep).values()} == {"finished"}


@pytest.mark.slow  # jobs long enough to be stopped
def test_ctrl_c_stops_the_jobs_on_the_cluster_each_with_its_checkpoint(two_nodes, tmp_path):
    from harness import checkpoint

    sweep = tmp_path / "sweep"
    args = ["+env=cartpole", "env.horizon=50", "iterations=100000", "checkpoint.every=5", "clip.max_norm=1,2,3"]
    driver = two_nodes.start_harness(
        "train", "-m", *args, *RAY_SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path, out=tmp_path / "out"
    )
    try:
        wait_for(lambda: len(checkpointed(sweep)) >= 2, 180, "a checkpoint of the job on each node")
        os.killpg(driver.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launching process's group
        code = driver.wait(timeout=180)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = (tmp_path / "out").read_text()
    assert code == 130, out
    assert own_lines(out)[-1] == (
        "train: sweep interrupted by SIGINT; its jobs were stopped, each keeping its newest complete checkpoint "
        "(resume=auto continues a job)"
    )
    assert "Traceback" not in out
    started = running(sweep)
    assert len(started) == 2  # one job on each node; the third never started
    for name in started:
        summary = json.loads((sweep / name / "summary.json").read_text())
        assert summary["status"] == "interrupted", summary
        newest = checkpoint.list_checkpoints(sweep / name / "checkpoints")[-1]
        assert checkpoint.load(newest)  # complete: the magic, the length and the checksum check out
    wait_for(lambda: not jobs_running(two_nodes), 30, "the jobs' processes to end")


@pytest.mark.slow  # a node is stopped and the rest of the sweep runs on the other
def test_a_node_stopped_mid_sweep_reports_its_job_and_the_rest_run_on(two_nodes, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["+env=cartpole", "env.horizon=50", "iterations=150", "log_every=50", "clip.max_norm=1,2,3"]
    driver = two_nodes.start_harness(
        "train", "-m", *args, *RAY_SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path, out=tmp_path / "out"
    )
    try:
        wait_for(lambda: len(running(sweep)) >= 2, 180, "a job on each node")
        two_nodes.stop_worker()
        code = driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = (tmp_path / "out").read_text()
    assert code == 1, out  # the lost job counts as failed
    lost = [line for line in out.splitlines() if "error: ray: the node running the job left the cluster" in line]
    assert len(lost) == 1, out
    assert f"sweep: 3 jobs: 2 finished, 1 failed ({sweep}" in out
    found = summaries(sweep)
    assert sorted(s["status"] for s in found.values()) == ["failed", "finished", "finished"]
    [name] = [n for n, s in found.items() if s["status"] == "failed"]
    assert lost[0].startswith(f"[job {int(name.split('=')[1]) - 1}: {name}]")
    assert "left the cluster" in found[name]["error"]
    report = run_harness("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "jobs: 3 (2 finished, 1 failed)" in report.stdout
    assert "left the cluster" in report.stdout
