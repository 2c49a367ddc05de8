"""What a run shows a person: TensorBoard event files and the progress line.

Events are written with tensorboardX (pure Python protobufs; no TensorFlow or PyTorch)
into the run folder itself, so ``tensorboard --logdir outputs/`` lists one run per
folder. The progress line is redrawn in place on a terminal and printed as plain
periodic lines otherwise (CI, pipes, files).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summaries


class RunLog:
    """TensorBoard writer plus progress line for one training run.

    Args:
        logdir: Folder that receives the event file.
        total: Number of iterations of the run (for the progress line).
        interactive: Redraw the progress line in place; default: whether ``stream`` is a TTY.
        stream: Where the progress line goes.
        purge_step: When resuming at this iteration, TensorBoard hides every event of this
            run at or after it that an earlier, interrupted process wrote (a ``SessionLog``
            START record), so resumed curves have neither duplicated nor missing steps.
    """

    def __init__(
        self,
        logdir: str | Path,
        *,
        total: int,
        interactive: bool | None = None,
        stream: TextIO = sys.stdout,
        purge_step: int | None = None,
    ):
        self.logdir = Path(logdir)
        self.total = total
        self.stream = stream
        self.interactive = stream.isatty() if interactive is None else interactive
        self.writer = SummaryWriter(logdir=str(self.logdir), flush_secs=3600, purge_step=purge_step)
        self._width = len(str(total))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Write one value per tag at ``step``."""
        for tag, value in values.items():
            self.writer.add_scalar(tag, float(value), global_step=step)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        """Write a histogram of the finite entries of ``values`` (skipped when there are none)."""
        flat = np.asarray(values, dtype=np.float64).ravel()
        flat = flat[np.isfinite(flat)]
        if flat.size:
            self.writer.add_histogram(tag, flat, global_step=step, bins="auto")

    def image(self, step: int, tag: str, image: np.ndarray) -> None:
        """Write an RGB image, uint8 of shape (height, width, 3)."""
        self.writer.add_image(tag, image, global_step=step, dataformats="HWC")

    def hparams(self, values: dict[str, bool | int | float | str], metrics: dict[str, float], *, step: int) -> None:
        """Record the run's hyperparameters and final metrics for the HParams dashboard.

        The experiment, session-start and session-end summaries go into this run's own
        event file (not a sub-folder), followed by one scalar per metric tag at ``step`` (the
        run's last iteration, so a resumed run's purge hides an earlier process's record),
        so every run of a sweep is one row of the HParams table.
        """
        experiment, start, end = hparams_summaries(values, {tag: 0.0 for tag in metrics})
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        self.scalars(step, metrics)
        self.writer.flush()

    def flush(self) -> None:
        self.writer.flush()

    def progress(self, iteration: int, *, loss: float, grad_norm: float, its_per_s: float) -> None:
        """Show iteration, loss, pre-clip gradient norm and iterations per second."""
        line = (
            f"[{iteration:>{self._width}d}/{self.total}] loss {loss:.6g}  |g|pre {grad_norm:.3e}  {its_per_s:.2f} it/s"
        )
        if self.interactive:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
        self.writer.close()
