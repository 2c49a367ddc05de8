"""Command line: ``python -m harness COMMAND [arguments]``.

Parses the command's name and hands the rest of the command line to its module,
:mod:`harness.commands.<name>` (imported only then, so ``--help`` imports nothing heavy).

It also owns the process's policy for signals and system errors, so that every command ends
in one line on stderr and the conventional exit code, wherever it was stopped:

- SIGINT (Ctrl-C) raises ``KeyboardInterrupt`` and SIGTERM raises :class:`Terminated`, in
  every command and at every moment (composing the config, building the env, a rollout,
  encoding a video, a sweep). ``finally`` blocks run on the way out, so a file being written
  is discarded, never left half-written (:func:`harness.runs.atomic_output`). The exit
  code is 128 + the signal: 130 for SIGINT, 143 for SIGTERM. Training replaces both handlers
  while it runs (:class:`harness.training.SignalStop`: the first signal finishes the
  iteration and writes a checkpoint, a second stops at once). A library that turns the
  signal's exception into one of its own (NumPy's import raises ``ImportError`` when the
  signal lands inside it), or swallows it so that the command returns as if never stopped,
  still ends in the signal's line and code: the handlers record every signal they receive.
- An ``OSError`` no command turned into a refusal (no space left on the device, a folder
  that cannot be written or resolved) is one line naming the path: exit 1.
- A config file that Hydra or OmegaConf cannot read (a broken YAML file in a
  ``HARNESS_CONFIG_PATH`` folder) is one line: exit 2.

A command's own refusals (exit 2) and failed checks (exit 1) are printed by the command.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any, NoReturn

from harness.commands import COMMANDS
from harness.commands.common import (
    Terminated,
    config_error_line,
    raise_if_signalled,
    record_signal,
    system_error_line,
)

# Our launcher presets share their names with the plugins' structured configs on purpose
# (`hydra/launcher=joblib`); Hydra 1.3 warns about the name match. Set at import time so
# that launcher worker processes, which import the commands, inherit it.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema")

__all__ = ["EXIT_ERROR", "EXIT_USAGE", "USAGE", "Terminated", "install_signal_handlers", "main"]

USAGE = (
    "usage: python -m harness COMMAND [overrides...]\n\ncommands:\n"
    + "".join(f"  {name:<11} {line}\n" for name, line in COMMANDS.items())
    + """
Overrides are Hydra's: optim.lr=0.05 clip.max_norm=1 iterations=50 device=cpu seed=3;
-m sweeps, e.g. -m clip.max_norm=0.1,1,10.
"""
)

EXIT_ERROR = 1
"""Exit code of a failed run or check and of a system error (no space left, a folder that
cannot be written)."""
EXIT_USAGE = 2
"""Exit code of bad input: a command line, config or file the command refuses."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    record_signal(signum)
    raise KeyboardInterrupt


def _raise_terminated(signum: int, frame: Any) -> None:
    record_signal(signum)
    raise Terminated


def install_signal_handlers() -> dict[int, Any]:
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM :class:`Terminated` from here on.

    SIGINT's default is set again even where the process started with it ignored (a
    background job of a non-interactive shell, ``cmd &`` in a script): every stop the
    harness makes on a signal is clean (the first Ctrl-C of a training run writes a
    checkpoint), and a caller that sends SIGINT expects it to arrive. Only from the main
    thread (elsewhere Python allows no handler); nothing happens in another thread.

    Returns:
        The handlers they replace, by signal (empty outside the main thread).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    record_signal(None)
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_terminated)
    return previous


@contextlib.contextmanager
def _hydra_errors_raised() -> Iterator[None]:
    """Hydra reports an exception raised inside a command itself: a shortened traceback and
    exit 1 (``hydra._internal.utils.run_and_report``). With ``HYDRA_FULL_ERROR`` set it
    raises it instead, so :func:`main` can print one line for a system error or a broken
    config file (an unexpected error still shows its full traceback). Set for the command,
    restored afterwards (launcher worker processes started meanwhile inherit it)."""
    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


def main(argv: list[str] | None = None) -> None:
    """Run one command (``argv``: the command line after ``python -m harness``); see the
    module docstring for what a signal or a system error does."""
    previous = install_signal_handlers()
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else ""
    try:
        with _hydra_errors_raised():
            try:
                _run(argv)
            except Exception:
                raise_if_signalled()  # a library turned the signal's exception into its own
                raise
            raise_if_signalled()  # or swallowed it: a signal received still ends the command as one
    except KeyboardInterrupt as exc:
        _stop(argv, signal.SIGINT, exc)
    except Terminated as exc:
        _stop(argv, signal.SIGTERM, exc)
    except BrokenPipeError:  # the reader went away (`... --help | head`): stop quietly, as `cat` does
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        sys.exit(128 + signal.SIGPIPE)  # 141, the shell's code for it
    except Exception as exc:
        line = system_error_line(exc)
        if line is not None:
            _say(f"error: {command}: {line}", EXIT_ERROR)
        line = config_error_line(exc)
        if line is None:
            raise
        _say(f"error: {command}: {line}", EXIT_USAGE)
    for sig, handler in previous.items():  # returned normally: a caller in Python gets its own back
        signal.signal(sig, handler)
    record_signal(None)  # nothing of this command's signals reaches the caller's next one


def _run(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    from harness import environment_error

    problem = environment_error()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if command not in COMMANDS:
        print(f"error: command: '{command}' is not one of {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    importlib.import_module(f"harness.commands.{command}").main(rest)


def _say(line: str, code: int) -> NoReturn:
    """Print ``line`` to stderr and exit with ``code``; further SIGINT/SIGTERM are ignored
    meanwhile, so the line is printed once and the code is the one promised."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)
    from harness import compile as kernel_compile

    kernel_compile.exit_now(code)  # a compile given up on: out at once (harness/compile.py)
    sys.exit(code)


def _stop(argv: list[str], signum: int, exc: BaseException) -> NoReturn:
    """One line for a command stopped by ``signum``: the exception's own message when it has
    one (a training run stopped at once names its newest checkpoint), else which command
    stopped. A sweep whose launcher runs its jobs in other processes (joblib) ends them:
    each job keeps its newest complete checkpoint."""
    given = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    name = signal.Signals(signum).name
    command = argv[0] if argv else "harness"
    if given:
        line = given
    elif any(a in ("-m", "--multirun") for a in argv[1:]):
        line = (
            f"{command}: sweep interrupted by {name}; its jobs were stopped, each keeping its newest complete "
            "checkpoint (resume=auto continues a job)"
        )
    else:
        line = f"{command}: interrupted by {name}; no file was left half-written"
    _say(line, 128 + signum)
