"""``python -m harness``: see :mod:`harness.cli`."""

import signal
import sys


class _Terminated(BaseException):
    """SIGTERM while the command line's modules are imported."""


_received: list[int] = []


def _interrupt(signum, frame):
    _received.append(signum)
    raise KeyboardInterrupt


def _terminate(signum, frame):
    _received.append(signum)
    raise _Terminated


def _keep_exit_code() -> None:
    """Let ``sys.exit``'s code stand after a Ctrl-C the harness handled. CPython (3.11) marks a
    KeyboardInterrupt that passes through ``exec`` or ``eval`` of a string (a dataclass being
    made, Warp reading a kernel's annotations) as unhandled, and then ends the process by
    SIGINT (status -2) whatever code it exits with; the mark is cleared here, on the way out."""
    import contextlib
    import ctypes

    with contextlib.suppress(Exception):  # another Python without the flag: nothing to clear
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0


if __name__ == "__main__":
    # Until harness.cli installs its own handlers: a signal while it is imported is one line too.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        from harness.cli import main
    except BaseException:  # a signal before any command started: nothing was written
        if not _received:  # not a signal: a broken install shows its traceback
            raise
    if _received:  # the last signal, also where an import turned its exception into an ImportError or swallowed it
        name = signal.Signals(_received[-1]).name
        print(f"interrupted by {name} before anything was written", file=sys.stderr)
        _keep_exit_code()
        sys.exit(128 + _received[-1])
    try:
        main()
    except SystemExit:
        _keep_exit_code()
        raise
