"""Signals and system errors end every command with one line and the conventional exit code
(130 SIGINT, 143 SIGTERM, 1 a system error, 2 bad input): real processes, real signals, a
real full disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import checkpoint
from tests.helpers import ROOT, harness_env, run_harness

TINY = ["+env=cartpole", "env.world_count=1", "device=cpu", "plot_every=null"]
SLOW_ITERATIONS = [*TINY, "env.horizon=300", "capture=false", "log_every=1", "iterations=100000"]
"""About a second per iteration on a 2-core CPU: a signal lands inside an iteration."""


class Harness:
    """``python -m harness ARGS`` started in its own session, its stdout read line by line."""

    def __init__(self, *args: str, cwd: Path, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness", *args],
            cwd=cwd,
            env=harness_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the whole group: killpg
        )
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()

    def wait_for(self, marker: str, timeout: float = 180) -> str:
        """The first stdout line holding ``marker`` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                found = next((line for line in self.lines if marker in line), None)
                if found is not None:
                    return found
                assert self.proc.poll() is None, f"ended before {marker!r}: " + "".join(self.lines)
                assert time.monotonic() < deadline, f"no {marker!r} in {timeout} s: " + "".join(self.lines)
                self._new.wait(0.1)

    def wait_for_library(self, name: str, timeout: float = 180) -> None:
        """Until the process has loaded a shared library whose path holds ``name`` (it is past
        its imports and working)."""
        deadline = time.monotonic() + timeout
        while name not in Path(f"/proc/{self.proc.pid}/maps").read_text():
            assert self.proc.poll() is None, "ended before loading " + name
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def signal(self, sig: int, *, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        """Exit code and stderr."""
        err = self.proc.stderr.read() if self.proc.stderr else ""
        self.proc.wait(timeout)
        return self.proc.returncode, err


def one_line(err: str) -> str:
    """The only non-empty line of ``err`` (asserting there is one and no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGINT, signal.SIGINT), pytest.param(signal.SIGTERM, signal.SIGINT, marks=pytest.mark.slow)],
)
def test_a_second_signal_stops_at_once_and_the_newest_checkpoint_loads(first, second, tmp_path):
    run_dir = tmp_path / "run"
    run = Harness("train", *SLOW_ITERATIONS, "checkpoint.every=1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    run.wait_for("it/s")  # past the warm-up: checkpoints are being written every iteration
    run.signal(first)
    notice = run.wait_for("stopping after iteration", timeout=10)  # said at once, on stdout
    assert f"{signal.Signals(first).name}: stopping after iteration" in notice
    assert "writing a checkpoint (Ctrl-C again to stop at once)" in notice
    run.signal(second)
    code, err = run.finish()
    assert code == 128 + second, err
    line = one_line(err)
    assert line.startswith(f"stopped at once by a second signal ({signal.Signals(second).name}) in iteration")
    newest = checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1]
    assert f"newest complete checkpoint: {newest} " in line
    assert checkpoint.load(newest).iteration >= 1  # complete and verified (magic, length, checksum)


def test_the_first_signal_names_the_iteration_the_run_stops_after(tmp_path):
    run_dir = tmp_path / "run"
    run = Harness("train", *SLOW_ITERATIONS, "checkpoint.every=0", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    run.wait_for("it/s")
    run.signal(signal.SIGTERM)
    promised = int(run.wait_for("stopping after iteration", timeout=10).split("after iteration ")[1].split()[0])
    code, err = run.finish()
    assert code == 143, err
    assert one_line(err).startswith(f"interrupted by SIGTERM after iteration {promised}; checkpoint written")
    assert checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(run_dir))[-1]).iteration == promised


@pytest.mark.parametrize("delay", [0.3, 2.0])
def test_ctrl_c_while_starting_or_composing_the_config_is_one_line(delay, tmp_path):
    """Whenever it lands before training (importing, composing the config, building the env)."""
    run = Harness("train", *TINY, "env.horizon=12", "iterations=3", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    time.sleep(delay)
    if run.proc.poll() is None:
        run.signal(signal.SIGINT)
    code, err = run.finish()
    if code == 0:  # it had finished already on a fast machine: nothing to check
        return
    assert code == 130, err
    # before the config is composed: "interrupted by SIGINT before anything was written"; once the
    # run compiles its kernels (a slow or loaded machine gets there by 2 s): "stopped at once while
    # Warp compiled kernels (SIGINT) ..."
    assert "SIGINT" in one_line(err)


def test_sigterm_while_the_env_is_built_is_one_line_and_exit_143(tmp_path):
    run = Harness("train", "+env=cloth", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    run.wait_for_library("warp")
    run.signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 143, err
    assert "SIGTERM" in one_line(err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_newton_imports_usd_is_one_line_and_its_own_code(sig, tmp_path):
    """Newton imports Pixar's USD as it loads; USD drops a signal landing in one of its native
    module initialisations and then fails on a half-registered type (exit 1). The harness holds
    the signal until the import is done."""
    run = Harness("gradcheck", *TINY, "env.horizon=2000", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    run.wait_for_library("pxr/Vt/_vt")  # USD's value types: loading, or just loaded
    run.signal(sig)
    code, err = run.finish()
    assert code == 128 + sig, err
    line = one_line(err)
    assert signal.Signals(sig).name in line and "gradcheck" in line, line


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny trained run folder (for evaluate and render) and a sweep of two (for report)."""
    root = tmp_path_factory.mktemp("signals")
    proc = run_harness("train", *TINY, "env.horizon=240", "iterations=2", f"hydra.run.dir={root / 'run'}", cwd=root)
    assert proc.returncode == 0, proc.stderr
    proc = run_harness(
        "train",
        "-m",
        *TINY,
        "env.horizon=12",
        "iterations=2",
        "seed=0,1",
        f"hydra.sweep.dir={root / 'sweep'}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    return root


COMMANDS = {
    # command line (RUN: the trained folder), the library loaded once it is working
    "gradcheck": (["gradcheck", *TINY, "env.horizon=2000", "hydra.run.dir=RUN_gradcheck"], "warp"),
    "record": (["record", *TINY, "env.horizon=20000", "out=RUN_traj.npz"], "warp"),
    "evaluate": (["evaluate", "RUN", "env.horizon=20000", "out=eval2.json"], "warp"),
    # render at a tenth of real time: about 15 s of work, not 2 (on an idle machine a signal a second
    # after warp loaded landed after the render had finished, exit 0)
    "render": (["render", "RUN", "speed=0.1"], "warp"),
    "report": (["report", "SWEEP"], "_multiarray_umath"),
}


@pytest.mark.parametrize(
    ("command", "sig"),
    [*((c, signal.SIGINT) for c in COMMANDS), ("render", signal.SIGTERM), ("record", signal.SIGTERM)],
)
def test_a_signal_inside_a_command_is_one_line_and_128_plus_the_signal(command, sig, trained):
    args, library = COMMANDS[command]
    args = [a.replace("SWEEP", str(trained / "sweep")).replace("RUN", str(trained / "run")) for a in args]
    run = Harness(*args, cwd=trained)
    run.wait_for_library(library)
    if command != "report":  # report is done in about a second
        time.sleep(1.0)
    run.signal(sig)
    code, err = run.finish()
    assert code == 128 + sig, err
    line = one_line(err)  # also run_hydra's own line when the env was still being built
    assert signal.Signals(sig).name in line and command in line, line
    assert not list(trained.glob("**/.*partial*")) and not list(trained.glob("**/*.tmp"))  # nothing half-written


SWALLOWING = """
import signal, sys, time
from harness import cli

def swallowing(argv):  # a library that catches the signal's exception and goes on
    try:
        signal.raise_signal(signal.SIG%s)
        time.sleep(0.1)
    except BaseException:
        pass
    print("finished as if never stopped")

cli._run = swallowing
cli.main(["render", "RUN"])
"""


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_a_signal_a_library_swallows_still_ends_the_command_with_its_line_and_code(name):
    """The render test's flake (exit 0, nothing on stderr, after a SIGINT a second into the
    render) is what a swallowed signal looks like: the command returns as if never stopped.
    A signal the harness's handler recorded ends the command as any other."""
    proc = subprocess.run([sys.executable, "-c", SWALLOWING % name], capture_output=True, text=True, timeout=60)
    sig = getattr(signal, f"SIG{name}")
    assert proc.returncode == 128 + sig, proc.stderr
    assert one_line(proc.stderr) == f"render: interrupted by SIG{name}; no file was left half-written"


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_ctrl_c_in_a_joblib_sweep_is_one_line_from_all_processes(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        *SLOW_ITERATIONS,
        "seed=0,1",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
    ]
    run = Harness("train", "-m", *args, cwd=tmp_path)
    run.wait_for("it/s")
    run.signal(signal.SIGINT, group=True)  # as a terminal sends it: to the parent and the workers
    code, err = run.finish()
    assert code == 130, err
    assert one_line(err).startswith("train: sweep interrupted by SIGINT")
    time.sleep(1)
    leftover = subprocess.run(["pgrep", "-f", str(sweep)], capture_output=True, text=True).stdout.split()
    assert not leftover  # no worker keeps running


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_ctrl_c_in_a_sweep_with_the_basic_launcher_stops_the_job_with_its_checkpoint(tmp_path):
    sweep = tmp_path / "sweep"
    run = Harness("train", "-m", *SLOW_ITERATIONS, "seed=0,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    run.wait_for("it/s")
    run.signal(signal.SIGINT, group=True)
    code, err = run.finish()
    assert code == 130, err
    assert "interrupted by SIGINT after iteration" in one_line(err) and "continue with:" in err
    assert checkpoint.load(checkpoint.list_checkpoints(checkpoint.checkpoint_dir(sweep / "seed=0"))[-1])


# -- system errors ---------------------------------------------------------------------------


def too_long(tmp_path: Path) -> Path:
    return tmp_path / ("a" * 300) / "run"


def symlink_loop(tmp_path: Path) -> Path:
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    return tmp_path / "loop_a" / "run"


def through_a_file(tmp_path: Path) -> Path:
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file" / "run"


@pytest.mark.parametrize("folder", [too_long, symlink_loop, through_a_file])
@pytest.mark.parametrize("command", ["train", "record"])
def test_a_folder_that_cannot_be_resolved_is_one_line_naming_it(command, folder, tmp_path):
    where = folder(tmp_path)
    if command == "train":
        proc = run_harness("train", *TINY, "env.horizon=12", "iterations=1", f"hydra.run.dir={where}", cwd=tmp_path)
    else:
        proc = run_harness("record", *TINY, "env.horizon=12", f"out={where / 'traj.npz'}", cwd=tmp_path)
    assert proc.returncode in (1, 2), proc.stderr
    line = one_line(proc.stderr)
    assert line.startswith("error: ") and str(where.parent.name)[:40] in line, line


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 1 MiB tmpfs filled to the last byte (skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        with open(mount / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
    except OSError:
        pass
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("command", ["train", "gradcheck", "record"])
def test_a_full_disk_is_one_line_naming_the_path(command, full_disk, tmp_path):
    if command == "record":
        args = ["record", *TINY, "env.horizon=12", f"out={full_disk / 'traj.npz'}"]
    else:
        args = [command, *TINY, "env.horizon=12", "iterations=1", f"hydra.run.dir={full_disk / 'run'}"]
    proc = run_harness(*args, cwd=tmp_path)
    # record refuses a destination it cannot write as bad input (2), before or after the rollout
    assert proc.returncode == (1 if command != "record" else 2), proc.stderr
    line = one_line(proc.stderr)
    assert "no space left" in line.lower() and str(full_disk) in line, line


def test_a_broken_yaml_file_in_a_user_config_folder_is_one_line_naming_its_line(tmp_path):
    (tmp_path / "configs" / "env").mkdir(parents=True)
    (tmp_path / "configs" / "env" / "broken.yaml").write_text("horizon: [1, 2\nmass: :\n")
    env = {"HARNESS_CONFIG_PATH": str(tmp_path / "configs")}
    for command in ("train", "gradcheck"):
        proc = run_harness(command, "+env=broken", "device=cpu", cwd=tmp_path, env=env)
        assert proc.returncode == 2, proc.stderr
        line = one_line(proc.stderr)
        assert "broken.yaml', line 2, column" in line, line
    assert not (tmp_path / "outputs").exists()


def test_a_ctrl_c_inside_exec_of_a_string_still_exits_130(tmp_path):
    """CPython marks a KeyboardInterrupt that passes through exec or eval of a string (as a
    dataclass is made, or Warp reads a kernel's annotations, while the env is built) as
    unhandled and ends the process by SIGINT (-2) whatever code it exits with. A user's env
    module whose import is interrupted inside exec (here: raises it there) must still end with
    the harness's line and 130."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "interrupted_env.py").write_text('exec("raise KeyboardInterrupt")\n')
    (tmp_path / "configs" / "env").mkdir(parents=True)
    (tmp_path / "configs" / "env" / "interrupted.yaml").write_text("_target_: interrupted_env.Env\n")
    env = {"PYTHONPATH": f"{tmp_path / 'code'}{os.pathsep}{ROOT}", "HARNESS_CONFIG_PATH": str(tmp_path / "configs")}
    proc = run_harness("train", "+env=interrupted", cwd=tmp_path, env=env)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert "interrupted by SIGINT" in one_line(proc.stderr)


def test_a_signal_a_library_turns_into_its_own_error_still_exits_128_plus_the_signal(tmp_path):
    """NumPy's C extension imports `datetime` through PyCapsule_Import, which replaces the
    KeyboardInterrupt of a Ctrl-C landing there with an ImportError (seen once in CI: `report`
    stopped while NumPy loaded). A user's env module does the same with a real signal sent to
    its own process: the command still ends in the signal's one line and code."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "swallowing_env.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
        "    raise ImportError('could not import module \"datetime\"') from None\n"
    )
    (tmp_path / "configs" / "env").mkdir(parents=True)
    (tmp_path / "configs" / "env" / "swallowing.yaml").write_text("_target_: swallowing_env.Env\n")
    env = {"PYTHONPATH": f"{tmp_path / 'code'}{os.pathsep}{ROOT}", "HARNESS_CONFIG_PATH": str(tmp_path / "configs")}
    proc = run_harness("train", "+env=swallowing", cwd=tmp_path, env=env)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    line = one_line(proc.stderr)
    assert "interrupted by SIGINT" in line and "train" in line, line


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_signal_turned_into_an_error_inside_a_sweep_job_stops_the_sweep(tmp_path):
    """The second job's env turns a real SIGINT into its own error while it is built: the sweep
    stops there as on a Ctrl-C (one line, 130) instead of counting a failed job and going on."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "converting_env.py").write_text(
        "import os, signal, time\n"
        "from envs.cartpole import CartpoleEnv\n\n"
        "class Env(CartpoleEnv):\n"
        "    def __init__(self, *args, **kw):\n"
        "        super().__init__(*args, **kw)\n"
        "        if self.horizon == 7:\n"
        "            try:\n"
        "                os.kill(os.getpid(), signal.SIGINT)\n"
        "                time.sleep(5)\n"
        "            except KeyboardInterrupt:\n"
        '                raise RuntimeError("a library\'s own error") from None\n'
    )
    env = {"PYTHONPATH": f"{tmp_path / 'code'}{os.pathsep}{ROOT}"}
    sweep = tmp_path / "sweep"
    proc = run_harness(
        "train", "-m", "+env=cartpole", "env._target_=converting_env.Env", "env.horizon=6,7,8", "env.world_count=1",
        "iterations=2", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    stopped = [line for line in proc.stderr.splitlines() if "sweep interrupted by SIGINT" in line]
    assert len(stopped) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads((sweep / "env.horizon=6" / "summary.json").read_text())["status"] == "finished"
    assert not (sweep / "env.horizon=8").exists()  # no job ran after the signal
