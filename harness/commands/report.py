"""``python -m harness report SWEEP_DIR``: the jobs of a Hydra multirun as a table sorted by
final loss, with a CSV and a PNG in the sweep folder (:mod:`harness.report`)."""

from __future__ import annotations

from pathlib import Path

from harness.commands.common import fail

__all__ = ["main"]


def main(args: list[str]) -> None:
    """``report SWEEP_DIR``: table sorted by final loss, CSV and PNG in the sweep folder."""
    from harness.report import ReportError, report_sweep

    if len(args) != 1 or args[0].startswith("-"):
        fail("report: expects one argument, the sweep folder (e.g. multirun/2026-11-22_10-00-00)")
    try:
        print(report_sweep(Path(args[0])))
    except ReportError as exc:
        fail(exc)
