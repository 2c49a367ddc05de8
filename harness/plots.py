"""Plots of a rollout against time: every per-step observable and an open-loop task's actions,
one panel per component, a reference run dashed and the current one solid.

:class:`SeriesFigure` is drawn on a worker thread for TensorBoard's ``loss/rollout``
(:class:`harness.training.callbacks.RolloutPlotLog`) and saved as ``render/rollout.png`` by
``python -m harness render`` (:func:`draw_plots`, written under a temporary name and renamed:
:func:`harness.runs.atomic_output`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.events import figure_rgb

__all__ = ["SeriesFigure", "draw_plots", "per_step_series"]


def per_step_series(horizon: int, observables: dict[str, Any], params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Host copies of what is worth plotting against time: every observable with one value
    per step, ``(horizon, worlds, dim)``, and every parameter laid out that way (an open-loop
    task's actions of width > 1, named ``<param> (trained)``; actions of width 1 are
    ``(horizon, worlds)`` and not repeated here: an env shows them as an observable, as the
    cartpole's ``controls``)."""
    values = {}
    for name, array in observables.items():
        value = array.numpy() if hasattr(array, "numpy") else np.asarray(array)
        if value.ndim == 3 and value.shape[0] == horizon:
            values[name] = value.copy()
    for name, value in params.items():
        if value.ndim == 3 and value.shape[0] == horizon:
            values[f"{name} (trained)"] = value.copy()
    return values


class SeriesFigure:
    """One panel per component of per-step series against time: a reference run dashed,
    the current one solid, one colour per world. Made once; :meth:`draw` redraws it in place
    with new values (for TensorBoard images at log steps), :meth:`save` writes a PNG.

    Args:
        series: A first set of values, ``{name: (horizon, worlds, dim)}``; fixes the panels.
        dt: The step length [s] (the time axis).
        names: Optional names of an observable's components (the env's ``component_names``).
        max_worlds: Draw at most this many worlds (the first ones).
        dpi: Resolution (the figure is 5 x 3.2 inches per panel, three panels a row).
    """

    STYLES = ("--", "-")
    """Line styles of the reference run and the current one."""

    def __init__(
        self,
        series: dict[str, np.ndarray],
        dt: float,
        names: dict[str, list[str]] | None = None,
        *,
        max_worlds: int | None = None,
        dpi: int = 100,
    ):
        # A Figure with its own Agg canvas, not pyplot: no global figure registry, so it can be
        # drawn on a worker thread while the loop's thread draws other images.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.panels = [(name, d) for name, values in series.items() for d in range(values.shape[2])]
        self.titles: list[str] = []
        if not self.panels:
            self.figure = None
            return
        worlds = min(next(iter(series.values())).shape[1], max_worlds or 1 << 30)
        self.worlds = worlds
        cols = min(3, len(self.panels))
        rows = (len(self.panels) + cols - 1) // cols
        self.figure = Figure(figsize=(5.0 * cols, 3.2 * rows), dpi=dpi)
        FigureCanvasAgg(self.figure)
        axes = self.figure.subplots(rows, cols, squeeze=False)
        self.axes = list(axes.flat)
        self.lines: list[list[list[Any]]] = []  # [panel][style][world]
        for ax, (name, d) in zip(self.axes, self.panels, strict=False):
            time = np.arange(1, series[name].shape[0] + 1) * dt
            styles = []
            for style in self.STYLES:
                styles.append(
                    [
                        ax.plot(time, np.full_like(time, np.nan), style, color=f"C{w % 10}", lw=1.2)[0]
                        for w in range(worlds)
                    ]
                )
            self.lines.append(styles)
            labels = (names or {}).get(name)
            title = f"{name}: {labels[d]}" if labels and d < len(labels) else f"{name}[{d}]"
            self.titles.append(title)
            ax.set_title(title)
            ax.set_xlabel("time [s]")
            ax.grid(alpha=0.3)
        for ax in self.axes[len(self.panels) :]:
            ax.axis("off")
        self._suptitle = self.figure.suptitle("")
        self._legend_labels: tuple[str, str] | None = None

    def draw(self, reference: dict[str, np.ndarray], current: dict[str, np.ndarray], labels: tuple[str, str]) -> None:
        """Set both runs' values (same names and shapes as at construction) and the legend."""
        for ax, (name, d), styles in zip(self.axes, self.panels, self.lines, strict=False):
            for values, lines in zip((reference[name], current[name]), styles, strict=True):
                for w, line in enumerate(lines):
                    line.set_ydata(values[:, w, d])
            ax.relim()
            ax.autoscale_view()
        if labels != self._legend_labels:
            self._legend_labels = labels
            first = self.lines[0]
            handles = [first[0][0], first[1][0]]
            text = [f"{labels[0]} (dashed)", f"{labels[1]} (solid)"]
            if self.worlds > 1:
                text = [f"{t}, world 0" for t in text]
            self.axes[0].legend(handles, text, fontsize=7, loc="best")
            self._suptitle.set_text(f"dashed: {labels[0]}, solid: {labels[1]}; one colour per world")
            self.figure.tight_layout()

    def image(self) -> np.ndarray:
        """The figure as an RGB uint8 array ``(height, width, 3)``."""
        return figure_rgb(self.figure)


def draw_plots(
    before: dict[str, np.ndarray],
    after: dict[str, np.ndarray],
    dt: float,
    path: Path,
    names: dict[str, list[str]] | None = None,
    *,
    labels: tuple[str, str] | list[str] = ("before training", "after training"),
) -> list[str]:
    """One panel per observable component: before (dashed) and after training (solid) against time.

    Args:
        before, after: By series name, ``(steps, worlds, dim)`` (:func:`per_step_series`).
        names: Optional names of an observable's components (the env's ``component_names``).
        labels: What the legend calls the two runs.

    Returns:
        The panel titles, in order (none, and no file, without per-step series).

    Raises:
        harness.runs.OutputError: One line: ``path`` cannot be written.
    """
    from harness.runs import atomic_output

    figure = SeriesFigure(after, dt, names)
    if figure.figure is None:
        return []
    figure.draw(before, after, (labels[0], labels[1]))
    with atomic_output(path) as tmp:  # a killed command leaves the previous file as it was
        figure.figure.savefig(tmp)
    return figure.titles
