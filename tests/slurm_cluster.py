"""A private single-node SLURM cluster on this machine, for tests/test_slurm.py.

Debian's ``slurm-wlm`` and ``munge`` (``make test-slurm`` installs them with apt-get): a
``munged`` with its own key and socket, a ``slurmctld`` and a ``slurmd`` (as root) from a
``slurm.conf`` of their own in a temporary folder, with free ports of their own, one node
(this machine, ``CPUs=2``) and one partition ``debug``. Nothing of the machine's own SLURM or
munge setup is read or changed: every client command of the test gets ``SLURM_CONF`` (the
cluster's :attr:`SlurmCluster.env`).

Every process of the cluster (the daemons, the ``slurmstepd`` of each job, the job's own
processes) carries ``SLURM_CONF`` pointing at this cluster's file in its environment, so
:meth:`SlurmCluster.stop` finds and kills them all, whatever state the test left them in.

Run by hand (``python -m tests.slurm_cluster`` in the repository) it starts a cluster, prints its
``SLURM_CONF`` and waits until Ctrl-C, then stops it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.processes import kill_until_none

MAKE_TARGET = "make test-slurm"
DAEMONS = ("munged", "slurmctld", "slurmd")
PARTITION = "debug"

SLURM_CONF = """\
ClusterName=harnesstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName={partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why a private cluster cannot start here (a reason naming the make target), or None."""
    absent = [name for name in (*DAEMONS, "sbatch", "sinfo", "squeue", "scancel") if shutil.which(name) is None]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} missing); {MAKE_TARGET} installs slurm-wlm and munge"
    if os.geteuid() != 0:
        return f"the private SLURM cluster runs its daemons as root; run {MAKE_TARGET} as root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """munged, slurmctld and slurmd of a private cluster rooted in a temporary folder."""

    def __init__(self, logs: Path | None = None) -> None:
        # A short root: munge's socket path must fit a sockaddr_un.
        self.root = Path(tempfile.mkdtemp(prefix="hslurm", dir="/tmp"))
        self.logs = logs
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.env.pop("SLURM_JOB_ID", None)  # a test run inside a SLURM job: its variables are not this cluster's
        self.daemons: dict[str, subprocess.Popen] = {}

    def start(self, timeout: float = 120.0) -> None:
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(mode=0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(
            SLURM_CONF.format(
                host=self.host,
                ctld_port=free_port(),
                slurmd_port=free_port(),
                munge_socket=self.munge_socket,
                root=self.root,
                partition=PARTITION,
            )
        )
        munge = self.root / "munge"
        self._daemon(
            "munged",
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={self.munge_socket}",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
            f"--log-file={munge}/munged.log",
        )
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged's socket")
        self._daemon("slurmctld", "slurmctld", "-D", "-f", str(self.conf))
        self._daemon("slurmd", "slurmd", "-D", "-f", str(self.conf), "-N", self.host)
        self._wait(self.node_idle, timeout, f"node {self.host} idle in sinfo")

    def _daemon(self, name: str, *argv: str) -> None:
        with (self.root / f"{name}.out").open("w") as out:
            self.daemons[name] = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, process in self.daemons.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {self.log_tail()}")
            time.sleep(0.5)

    def node_idle(self) -> bool:
        state = self.run("sinfo", "--noheader", "--nodes", self.host, "--format=%T", check=False)
        return state.returncode == 0 and state.stdout.strip().rstrip("*") == "idle"

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def jobs(self) -> dict[str, str]:
        """The cluster's jobs that squeue still lists, ``{job id: state}`` (array tasks as ``ID_N``)."""
        out = self.run("squeue", "--noheader", "--array", "--format=%i %T", check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def processes(self) -> list[int]:
        """Every living process of this cluster: those whose environment names its slurm.conf
        (the daemons, each job's slurmstepd and processes), and the daemons themselves."""
        marker = f"SLURM_CONF={self.conf}".encode() + b"\0"
        found = {p.pid for p in self.daemons.values() if p.poll() is None}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.add(int(entry.name))
        return sorted(found)

    def stop(self) -> None:
        """Stop every process of the cluster, until none is left (a slurmd may start a job step
        between a listing and its kill), then remove its folder (its logs are copied to
        ``logs`` first, when given)."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--user=root", "--full", check=False)
        if self.logs is not None:
            with contextlib.suppress(OSError):
                self.logs.mkdir(parents=True, exist_ok=True)
                for path in [*self.root.glob("*.log"), *self.root.glob("*.out"), self.conf]:
                    shutil.copy(path, self.logs / path.name)
        kill_until_none(self.processes)
        for process in self.daemons.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    why = missing()
    if why:
        raise SystemExit(why)
    cluster = SlurmCluster()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped by a kill too: the cluster with it
    try:
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print(f"stopped; {len(cluster.processes())} processes left", flush=True)
