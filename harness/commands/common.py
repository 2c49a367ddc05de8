"""What the commands share: one-line failures, Hydra's own flags, run-folder overrides, and
running a Hydra command line.

A command module (:mod:`harness.commands.train`, ...) parses its arguments, loads what it
needs, runs and prints; what two of them need is here, so no command imports another.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

# Our launcher presets share their names with the plugins' structured configs on purpose
# (`hydra/launcher=joblib`); Hydra 1.3 warns about the name match. Set when a command is
# imported, so launcher worker processes, which import the commands, inherit it.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema")

__all__ = [
    "HYDRA_INFO_VALUES",
    "HYDRA_INSPECT_FLAGS",
    "HYDRA_VALUE_FLAGS",
    "Terminated",
    "collector_paused",
    "dirname_overrides",
    "fail",
    "raise_if_signalled",
    "record_signal",
    "register_launchers",
    "run_dir_override",
    "run_hydra",
    "split_hydra_flags",
    "stop",
]


class Terminated(BaseException):
    """SIGTERM arrived. Raised by the handler :func:`harness.cli.install_signal_handlers` installs, so
    that the command stops as it does on Ctrl-C (``finally`` blocks run) and exits 143.

    A ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` (Hydra's error
    report, a command's cleanup of a failed run) does not swallow it. Its message, when
    given, is the one line printed at the end.
    """

    signum = 15  # signal.SIGTERM


_signals: list[int] = []
"""The signals received during this command (:func:`harness.cli.install_signal_handlers`'
handlers record each)."""


def record_signal(signum: int | None) -> None:
    """Record that ``signum`` arrived; ``None`` forgets every signal (a new command starts)."""
    if signum is None:
        _signals.clear()
    else:
        _signals.append(signum)


def raise_if_signalled() -> None:
    """Raise the exception of the last signal received during this command, if one was.

    Called before a failure is reported, and after a command returns: a library may turn the
    signal's exception into one of its own (NumPy's C extension imports ``datetime`` through
    ``PyCapsule_Import``, which replaces a ``KeyboardInterrupt`` landing there with an
    ``ImportError``) or swallow it. The user stopped the command, so its line and exit code
    are the signal's, not the failure's or a success's."""
    if _signals:
        raise KeyboardInterrupt if _signals[-1] == signal.SIGINT else Terminated


def stop(code: int) -> NoReturn:
    """Exit with ``code`` after a signal: at once when a kernel compile was given up on
    (:func:`harness.compile.exit_now`), else through the interpreter's normal exit."""
    from harness import compile as kernel_compile

    kernel_compile.exit_now(code)
    sys.exit(code)


def fail(exc: Exception | str) -> NoReturn:
    """Print ``error: <one line>`` to stderr and exit 2 (bad input; nothing was written),
    unless a signal arrived meanwhile (:func:`raise_if_signalled`)."""
    raise_if_signalled()
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)


HYDRA_VALUE_FLAGS = frozenset(
    {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
    | {"--experimental-rerun"}
)
"""Hydra's own command-line flags that take a value (``--cfg job``, ``-cn my_train``)."""
HYDRA_INFO_VALUES = frozenset({"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"})
"""The values ``--info`` / ``-i`` may take (it also stands alone)."""
HYDRA_INSPECT_FLAGS = frozenset(
    {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc"}
)
"""Flags with which Hydra prints something and exits without running the command."""


def split_hydra_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """Split a command line into Hydra's own flags (with their values) and overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    pending = False  # the previous flag takes the next word as its value
    optional = False  # the previous flag (--info) may take the next word
    for arg in args:
        if pending or (optional and arg in HYDRA_INFO_VALUES):
            flags.append(arg)
            pending = optional = False
            continue
        optional = False
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            flags.append(arg)
            pending = name in HYDRA_VALUE_FLAGS and "=" not in arg
            optional = name in ("--info", "-i") and "=" not in arg
        else:
            overrides.append(arg)
    return flags, overrides


def run_dir_override(folder: str | Path) -> str:
    """``hydra.run.dir=<folder>`` as Hydra parses it: quoted when the name holds characters
    of Hydra's override grammar (job folders of a sweep are named like ``clip.max_norm=1,seed=2``)."""
    text = str(folder)
    if not any(c in text for c in ",=[]{}()'\" \\"):
        return f"hydra.run.dir={text}"
    return "hydra.run.dir='" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def dirname_overrides(args: list[str]) -> list[str]:
    """Which overrides name a run's folder.

    A single run's folder is ``outputs/<env>/<date>_<time>_<overrides>``: its command-line
    overrides except the env (already the parent folder), ``resume``, ``overwrite``, ``device`` and
    Hydra's own (never part of it), so runs side by side in TensorBoard can be told apart by name. In a
    multirun, job folders are named by the swept values only: the command-line overrides
    that are the same for every job (``+env=cartpole iterations=50``) would only make the
    names long; what stays are the command-line sweeps and the sweeper's own parameters (an
    experiment's ``hydra.sweeper.params``, Optuna's search space).

    Returns an override setting ``hydra.job.config.override_dirname.exclude_keys``.
    """
    keys = dirname_excluded_keys(args)
    if not keys:
        return []
    return ["hydra.job.config.override_dirname.exclude_keys=[" + ",".join(f"'{k}'" for k in keys) + "]"]


def dirname_excluded_keys(args: list[str]) -> list[str]:
    """The override keys :func:`dirname_overrides` leaves out of a folder's name (empty: the
    command line keeps Hydra's default)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = any(a in ("-m", "--multirun") for a in args)
    try:
        parsed = OverridesParser.create().parse_overrides(split_hydra_flags(args)[1])
    except Exception:  # Hydra reports malformed overrides itself
        return []
    if multirun:
        keys = [o.key_or_group for o in parsed if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    else:
        keys = [o.key_or_group for o in parsed if o.key_or_group in ("env", "resume", "overwrite", "device")]
    return ["hydra.run.dir", "hydra.sweep.dir", *dict.fromkeys(keys)] if keys else []


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a command imports Newton and the env's
    modules and builds the env: what that allocates (modules, kernels, the model) lives as
    long as the process, and every collection in between would walk all of it again (about a
    third of Newton's import time, docs/startup.md). On the way out every object alive is
    moved into the collector's permanent generation (``gc.freeze()``: no later collection
    walks them, nor the one at exit) and the collector runs again; nothing changes when it was
    not running."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.freeze()
            gc.enable()


def run_hydra(command: str, config_name: str, main: Callable[[], object], rest: list[str]) -> None:
    """Run a Hydra command (``@hydra.main`` function ``main`` of ``configs/<config_name>.yaml``)
    on the command line ``rest``: Hydra's flags pass through; otherwise the whole command line
    is checked first (:func:`harness.build.precheck`: nothing is written and no kernel compiles
    before it passes), a resume continues in its checkpoint's folder, the folders of
    :data:`harness.config.CONFIG_PATH_VARIABLE` join the search path, and a run folder is named
    by its overrides (:func:`dirname_overrides`). Warp is initialised where it is first needed
    (:func:`harness.init_warp`: the device check, the env's build, the command itself): Hydra's
    flags import neither Warp nor Newton, and a refused command line no Newton."""
    from harness import config

    flags, overrides = split_hydra_flags(rest)
    inspect = any(f.split("=", 1)[0] in HYDRA_INSPECT_FLAGS for f in flags)
    if not inspect:  # --cfg, --info, --help run nothing
        from harness import build

        multirun = [f for f in flags if f in ("-m", "--multirun")]
        with collector_paused():
            try:
                resume_folder = build.precheck(config_name, [*multirun, *overrides])
            except config.ConfigError as exc:
                fail(exc)
            except KeyboardInterrupt:  # e.g. while the env is built: no folder exists yet
                print(f"{command}: interrupted by SIGINT before it started; nothing was written", file=sys.stderr)
                stop(130)
            except Terminated:
                print(f"{command}: interrupted by SIGTERM before it started; nothing was written", file=sys.stderr)
                stop(143)
        if resume_folder is not None and not any(a.startswith("hydra.run.dir=") for a in overrides):
            overrides = [*overrides, run_dir_override(resume_folder)]  # continue in the checkpoint's folder
        if config_name == "train":
            overrides = _claim_folders(overrides, multirun=bool(multirun))
    try:
        overrides = config.search_path_overrides(overrides)
    except config.ConfigError as exc:
        fail(exc)
    # Overrides first, Hydra's flags last: its parser takes the overrides as one positional
    # list, and a bare --info would take a following override as its value.
    config.register_resolvers()
    register_launchers()
    # Hydra 1.3's @hydra.main takes its command line from sys.argv only (no public argument
    # for it): set for the call, restored afterwards.
    saved = sys.argv
    sys.argv = [f"harness {command}", *overrides, *dirname_overrides([*flags, *overrides]), *flags]
    try:
        if any(f in ("--help", "-h") for f in flags):
            buffer = io.StringIO()
            try:
                with contextlib.redirect_stdout(buffer):
                    main()
            finally:  # Hydra may end with SystemExit after printing
                print(user_help(buffer.getvalue()), end="", flush=True)
        else:
            main()
    finally:
        sys.argv = saved
    from harness import sweep

    if inspect:  # the config was printed, nothing run: no folder its names claimed is kept
        config.release_unused_folders()
    if sweep.sweep_failed():  # a job failed or was killed: the sweep's line counted it
        sys.exit(1)


def register_launchers() -> None:
    """Make the harness's own Hydra launchers (``hydra/launcher=ray``,
    ``hydra_plugins/harness_ray_launcher``; ``hydra/launcher=submitit_slurm``,
    ``hydra_plugins/harness_submitit_launcher``) known to Hydra however the harness is installed.
    Hydra finds plugins by walking its ``hydra_plugins`` package with ``pkgutil``, which does
    not see a folder that setuptools' editable install maps through its import finder (``pip
    install -e .``): registered here, the launchers work from a wheel, an editable install or a
    checkout on ``PYTHONPATH`` alike. Neither Ray, submitit nor the harness's library is imported."""
    from hydra.core.plugins import Plugins

    from hydra_plugins.harness_ray_launcher.ray_launcher import RayLauncher
    from hydra_plugins.harness_submitit_launcher.submitit_launcher import SlurmLauncher

    Plugins.instance().register(RayLauncher)
    Plugins.instance().register(SlurmLauncher)


def _given(overrides: list[str]) -> dict[str, str]:
    """The plain ``key=value`` overrides of a command line, by key (the values as written)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra reports malformed overrides itself
        return {}
    return {o.key_or_group: str(o.value()) for o in parsed if not o.is_sweep_override()}


def _claim_folders(overrides: list[str], *, multirun: bool) -> list[str]:
    """Before Hydra writes into a folder named on the command line, make sure the run may:
    a single run's ``hydra.run.dir`` is locked by this process (:func:`harness.runs.claim_run_folder`:
    refused when another process writes there, or when it holds a run and neither
    ``resume=`` nor ``overwrite=true`` was given); a sweep whose job folders (under an
    existing ``hydra.sweep.dir``) hold runs is refused likewise (:func:`_sweep_job_folders`;
    each job then claims its own folder). A resumed run, and every job of a resumed sweep,
    keeps its folder's ``.hydra/`` as it was (``hydra.output_subdir=null``). Default folders
    are fresh (``harness.unique``); a run claims its folder itself, whatever named it
    (:func:`harness.commands.train._prepare`).
    ``resume`` and ``overwrite`` are read from the composed config (an experiment may set
    them) when :func:`harness.build.precheck` composed it, else from the command line."""
    from harness import build
    from harness.runs import RunError, claim_run_folder, holds_run

    given = _given(overrides)
    settings = build.PRECHECKED
    resume_value = settings["resume"] if "resume" in settings else given.get("resume")
    resume = resume_value not in (None, "None", "null")
    overwrite = settings["overwrite"] if "overwrite" in settings else given.get("overwrite", "").lower() == "true"
    if multirun:
        folder = given.get("hydra.sweep.dir")
        if resume:  # each job keeps its .hydra/ as it was; a new job writes its own (train_command)
            return [*overrides, "hydra.output_subdir=null"]
        if folder is None or "${" in folder or overwrite or not Path(folder).is_dir():
            return overrides
        held = [job for job in _sweep_job_folders(Path(folder), overrides) if holds_run(job)]
        if held:
            fail(
                f"hydra.sweep.dir: '{folder}' holds runs of an earlier sweep in {len(held)} of this sweep's job "
                f"folders (e.g. '{held[0].name}'); accepted: resume=auto to continue them, overwrite=true to "
                "replace them, or another folder"
            )
        return overrides
    folder = given.get("hydra.run.dir")
    if folder is None or "${" in folder:  # a name Hydra resolves: the run claims it (train._prepare)
        return overrides
    try:
        claim_run_folder(folder, resume=resume, overwrite=overwrite)
    except RunError as exc:
        fail(exc)
    if resume and (Path(folder) / ".hydra" / "overrides.yaml").is_file():
        overrides = [*overrides, "hydra.output_subdir=null"]
    return overrides


def _sweep_job_folders(sweep_dir: Path, overrides: list[str]) -> list[Path]:
    """The job folders a basic-sweeper multirun of ``overrides`` will write under
    ``sweep_dir``: each job's overrides as Hydra names its folder (``override_dirname``, less
    the keys :func:`dirname_overrides` excludes). Empty for another sweeper or a changed
    ``hydra.sweep.subdir`` (whose job folders only Hydra knows; each job still claims its own)."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
        if any(o.key_or_group in ("hydra/sweeper", "hydra.sweep.subdir") for o in parsed):
            return []
        task = [o for o in parsed if not o.key_or_group.startswith(("hydra.", "hydra/"))]
        jobs = BasicSweeper.split_arguments(task, None)[0]
        exclude = dirname_excluded_keys(["-m", *overrides]) or ["hydra.run.dir", "hydra.sweep.dir"]
        return [sweep_dir / get_overrides_dirname(parser.parse_overrides(job), exclude, ",", "=") for job in jobs]
    except Exception:  # Hydra reports malformed overrides and unsupported sweeps itself
        return []


def user_help(text: str) -> str:
    """Hydra's ``--help`` text without the config groups a user never picks: ``base`` (what
    every clip and schedule option shares) and the nested ones (``optim/task``, ``optim/env``,
    ``schedule/task``), which a task or an env chooses from its own config."""
    head, sep, rest = text.partition("== Config ==")  # the groups are listed above the config
    shown = (line for line in head.splitlines(keepends=True) if not re.match(r"(base|[\w.-]+/[\w./-]+): ", line))
    return "".join(shown) + sep + rest


def run_folder_argument(
    args: list[str], command: str, options: tuple[str, ...]
) -> tuple[Path, dict[str, str], list[str]]:
    """Split ``RUN_DIR [key=value ...]``: the run folder (a sweep's job folder may hold '='), the
    command's own ``options`` and the remaining ``key=value`` overrides.

    Raises:
        ValueError: One line: not exactly one folder.
    """
    folders, found, overrides = [], {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq or not key.replace(".", "").replace("_", "").isalnum():
            folders.append(arg)
        elif key in options:
            found[key] = value
        else:
            overrides.append(arg)
    if len(folders) != 1 or folders[0].startswith("-"):
        raise ValueError(f"{command}: expects one run folder, e.g. python -m harness {command} outputs/cartpole/<time>")
    return Path(folders[0]), found, overrides


# Signals and system errors: the one line a command ends with (see harness.cli).

_ERRNO_TEXT = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENAMETOOLONG: "a name in the path is too long",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EISDIR: "it is a folder",
    errno.ENOENT: "no such file or folder",
    errno.EIO: "input/output error",
}
"""How :func:`os_error_line` says the common errors (else the system's own words)."""


def _file_in_use(exc: BaseException) -> str | None:
    """The file open in the frame that raised ``exc`` (a ``write()`` that failed names none),
    else the first path that frame holds."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    values = list(tb.tb_frame.f_locals.values())
    for value in values:
        name = getattr(value, "name", None) if isinstance(value, io.IOBase) else None
        if isinstance(name, str | os.PathLike):
            return os.fsdecode(name)
    return next((os.fsdecode(value) for value in values if isinstance(value, os.PathLike)), None)


def os_error_line(exc: OSError, *related: BaseException) -> str:
    """``'<path>': no space left on the device``: the path (both of a rename; where the error
    names none, the file being written when it happened, found from ``exc`` or the
    ``related`` exceptions raised with it), then why in words."""
    why = _ERRNO_TEXT.get(exc.errno) if exc.errno is not None else None
    why = why or (exc.strerror or str(exc) or type(exc).__name__).rstrip(".")
    why = why[:1].lower() + why[1:]
    paths = [os.fsdecode(p) for p in (exc.filename, exc.filename2) if p is not None]
    if not paths:
        found = next(filter(None, (_file_in_use(e) for e in (exc, *related))), None)
        return why if found is None else f"'{found}': {why}"
    return " -> ".join(f"'{p}'" for p in paths) + f": {why}"


def system_error_line(exc: BaseException) -> str | None:
    """One line for the first system error behind ``exc`` (an ``OSError``, or a file the
    harness could not write, :class:`harness.runs.OutputError`), following the exceptions
    raised while handling it: on a full disk the checkpoint that could not be written, not
    the summary.json that then could not be written either. None when there is none (a bug
    keeps its traceback)."""
    runs = sys.modules.get("harness.runs")
    output_error = getattr(runs, "OutputError", None) if runs is not None else None
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        # ``raise ... from None`` (a refusal made of an OSError) ends the chain there
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    errors = [e for e in chain if isinstance(e, OSError) or (output_error is not None and isinstance(e, output_error))]
    if not errors:
        return None
    found = errors[-1]  # the deepest one happened first
    return os_error_line(found, *reversed(chain)) if isinstance(found, OSError) else str(found)


def config_error_line(exc: BaseException) -> str | None:
    """One line for a config file Hydra, OmegaConf or YAML could not read (a YAML syntax
    error names the file, line and column), or None for any other exception."""
    kinds: list[type] = []
    for module, name in (("yaml", "YAMLError"), ("hydra.errors", "HydraException")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    if "omegaconf.errors" in sys.modules:
        kinds.append(sys.modules["omegaconf.errors"].OmegaConfBaseException)
    if not kinds or not isinstance(exc, tuple(kinds)):
        return None
    mark = getattr(exc, "problem_mark", None)  # yaml's MarkedYAMLError: where the file is broken
    if mark is not None and getattr(exc, "problem", None):
        context = f" ({exc.context})" if getattr(exc, "context", None) else ""
        return f"'{mark.name}', line {mark.line + 1}, column {mark.column + 1}: {exc.problem}{context}"
    texts = [str(exc)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(texts) < 4:
        if str(cause) not in texts[-1]:
            texts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return "; ".join(" ".join(part.split()) for part in texts if part.strip()) or type(exc).__name__


@contextlib.contextmanager
def system_errors_in_one_line(command: str) -> Iterator[None]:
    """Inside a Hydra task function: a system error (:func:`system_error_line`) ends the
    command with ``error: <command>: <line>`` and exit 1. Hydra would print its own report
    of the exception first ("Error executing job with overrides: ..."), so a command run
    through ``@hydra.main`` catches it here, before Hydra does; any other exception passes."""
    try:
        yield
    except Exception as exc:
        raise_if_signalled()
        line = system_error_line(exc)
        if line is None:
            raise
        with contextlib.suppress(OSError):
            sys.stdout.flush()
        print(f"error: {command}: {line}", file=sys.stderr, flush=True)
        sys.exit(1)
