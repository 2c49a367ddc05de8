"""``python -m harness report SWEEP_DIR``: every job of a Hydra multirun with its status, as a
table sorted by status and final loss and a line of counts, with a CSV and a PNG in the sweep
folder (:mod:`harness.report`)."""

from __future__ import annotations

from pathlib import Path

from harness.commands.common import fail

__all__ = ["main"]


def main(args: list[str]) -> None:
    """``report SWEEP_DIR``: table sorted by final loss, CSV and PNG in the sweep folder."""
    from harness.report import ReportError, report_sweep
    from harness.runs import OutputError

    if len(args) != 1 or args[0].startswith("-"):
        fail("report: expects one argument, the sweep folder (e.g. multirun/2026-11-22_10-00-00)")
    try:
        print(report_sweep(Path(args[0])))
    except ReportError as exc:
        fail(exc)
    except OutputError as exc:  # report.csv or report.png cannot be written there
        fail(f"report: {exc}")
