"""The sweep report (``python -m harness report SWEEP_DIR``): compare the jobs of a Hydra multirun.

Reads every job folder of a sweep (the folders holding ``.hydra/overrides.yaml``): the
overrides that differ between jobs are the swept values; ``summary.json`` gives the
outcome; the TensorBoard events give the loss curve. Every job is listed with its status
(:data:`STATUSES`), whatever state its folder is in: a sweep that is still running, jobs
that failed, diverged or were killed, jobs without events or with nan/inf curves, every job
failed. A line counts the jobs of each status and those without a loss curve.

Writes ``report.csv`` and ``report.png`` into the sweep folder and returns the table as
text, sorted by final loss. ``seed`` is treated as replicates: when it is swept, a second
table (also ``report_by_value.csv``) gives, per value of the other swept keys, the number
of seeds and the mean and standard deviation of the final loss, the mean clipped fraction
and the mean of the jobs' median pre-clip gradient norm. The PNG shows the loss curves
against the iteration counted from 1 as TensorBoard's step (one colour per value of the
first swept key, one line style per seed or per value of the other keys, each in the legend
beside the axes) and, against the first swept key, the final loss, the clipped fraction and
the median pre-clip norm: every job a grey dot, the mean over seeds with a bar from the
smallest to the largest seed (which, unlike mean +- std, stays within a log axis and 0-100 %),
one legend below the three panels (:func:`report_figure`).

A job stopped by SIGINT/SIGTERM (a scheduler's pre-emption) is ``interrupted``, with the
iterations it completed. A job is ``diverged`` when its summary says so (training stopped
at a divergence: the iteration and what diverged), or when it finished with a final loss
that is not finite or above ``DIVERGED_FACTOR`` times its initial loss, or any step had
non-finite gradients.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from harness import tags
from harness.files import read_small_text
from harness.runs import OutputError, atomic_output

DIVERGED_FACTOR = 2.0
"""A finished job whose final loss exceeds this multiple of its initial loss diverged."""

STATUSES = ("finished", "diverged", "interrupted", "unfinished", "failed")
"""A job's status, in the order the table lists them: ``finished`` (``summary.json`` written
at the end), ``diverged`` (see the module docstring), ``interrupted`` (SIGINT/SIGTERM after a
checkpoint), ``unfinished`` (no ``summary.json``: still running, or killed), ``failed`` (the
summary says so, with the error, or it cannot be read). A summary with another status is
listed with that status, after these."""

NO_SUMMARY = "no summary.json: running or killed"
"""The detail of an ``unfinished`` job."""


class ReportError(ValueError):
    """The folder is not a sweep the report can read."""


@dataclasses.dataclass
class JobRow:
    """One job of a sweep."""

    folder: Path
    overrides: dict[str, str]
    status: str
    final_loss: float = math.nan
    best_loss: float = math.nan
    clipped_fraction: float = math.nan
    nonfinite_steps: float = math.nan
    wall_time_s: float = math.nan
    error: str = ""
    curve: tuple[list[int], list[float]] = ((), ())
    norm_pre_median: float = math.nan
    curve_note: str = ""
    """Why the job has no loss curve (no event file, no loss in its events, unreadable events)."""
    episode_return: float = math.nan
    """A policy's mean return over whole episodes after training (``summary.json``'s ``episodes``)."""
    upright: float = math.nan
    """The same episodes' upright fraction."""


def _overrides(job: Path) -> dict[str, str] | None:
    """The job's command-line overrides by key; None when ``.hydra/overrides.yaml`` cannot be read."""
    try:
        text = read_small_text(job / ".hydra" / "overrides.yaml", "report", accepted="Hydra's overrides.yaml")
        lines = yaml.safe_load(text) or []
        parsed = OverridesParser.create().parse_overrides([str(line) for line in lines])
    except Exception:  # a damaged file (a yaml, a parser or an OS error): the row says so
        return None
    return {o.key_or_group: o.value() if isinstance(o.value(), str) else str(o.value()) for o in parsed}


def _curves(job: Path) -> tuple[tuple[list[int], list[float]], float, str]:
    """The loss curve, the median pre-clip gradient norm (of its finite values) and, when there
    is no curve, why, from the job's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not list(job.glob("events.out.tfevents.*")):
        return ([], []), math.nan, "no event file"
    try:
        acc = EventAccumulator(str(job), size_guidance={"scalars": 0})
        acc.Reload()
        found = acc.Tags().get("scalars", [])
        curve: tuple[list[int], list[float]] = ([], [])
        if tags.LOSS_TOTAL in found:
            events = acc.Scalars(tags.LOSS_TOTAL)
            curve = ([e.step for e in events], [e.value for e in events])
        # grad/norm_pre: the tag's name in runs made before the tag groups were renamed
        norm_tag = next((t for t in (tags.optim(tags.GRAD_NORM_PRE), "grad/norm_pre") if t in found), None)
        norms = [e.value for e in acc.Scalars(norm_tag)] if norm_tag else []
    except Exception as exc:  # a damaged event file: TensorBoard's reader raises many kinds
        return ([], []), math.nan, f"events unreadable ({type(exc).__name__})"
    norms = [v for v in norms if math.isfinite(v)]
    return curve, float(np.median(norms)) if norms else math.nan, "" if curve[0] else "no loss in the events"


def _number(summary: dict[str, Any], key: str) -> float:
    """``summary[key]`` as a float; nan when missing or not a number."""
    try:
        return float(summary[key])
    except (KeyError, TypeError, ValueError):
        return math.nan


def _read_job(job: Path) -> JobRow:
    curve, norm, note = _curves(job)
    overrides = _overrides(job)
    row = JobRow(
        folder=job,
        overrides=overrides or {},
        status="unfinished",
        error=NO_SUMMARY,
        curve=curve,
        norm_pre_median=norm,
        curve_note=note,
    )
    if overrides is None:
        row.status, row.error = "failed", ".hydra/overrides.yaml is unreadable"
        return row
    summary_path = job / "summary.json"
    if not summary_path.exists():
        return row
    try:
        summary = json.loads(read_small_text(summary_path, "report", accepted="a run's summary.json"))
        if not isinstance(summary, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, UnicodeDecodeError):
        row.status, row.error = "failed", "summary.json is unreadable"
        return row
    status = str(summary.get("status", "finished"))
    row.error = ""
    if status == "failed":
        row.status, row.error = "failed", str(summary.get("error", "")) or "no error given"
        return row
    row.final_loss = _number(summary, "final_loss")
    row.best_loss = _number(summary, "best_loss")
    episodes = summary.get("episodes")
    after = episodes.get("after") if isinstance(episodes, dict) else None
    if isinstance(after, dict):
        row.episode_return = _number(after, "episode_return")
        row.upright = _number(after, "upright_fraction")
    row.nonfinite_steps = _number(summary, "nonfinite_steps")
    row.wall_time_s = _number(summary, "wall_time_s")
    total = _number(summary, "iterations")
    done = _number(summary, "iterations_done")
    done = total if math.isnan(done) else done
    row.clipped_fraction = _number(summary, "clipped_steps") / max(done, 1) if math.isfinite(done) else math.nan
    initial = _number(summary, "initial_loss")
    diverged = (
        not math.isfinite(row.final_loss) or row.final_loss > DIVERGED_FACTOR * initial or row.nonfinite_steps > 0
    )
    if status == "interrupted":
        row.status = "interrupted"
        row.error = f"{summary.get('signal', 'signal')} after {_fmt(done, '.0f')} of {_fmt(total, '.0f')} iterations"
    elif status == "diverged":  # training stopped at the divergence
        where = summary.get("diverged")
        where = where if isinstance(where, dict) else {}
        at = where.get("iteration")
        what = where.get("what")
        row.status = "diverged"
        row.error = ", ".join(x for x in (f"at iteration {at}" if at is not None else "", str(what or "")) if x)
    elif status == "finished":
        row.status = "diverged" if diverged else "finished"
    else:
        row.status = status
    return row


def collect(sweep_dir: Path) -> tuple[list[JobRow], list[str]]:
    """Every job of the sweep and the keys whose values differ between jobs."""
    if not sweep_dir.is_dir():
        raise ReportError(f"report: '{sweep_dir}' is not a folder")
    if (sweep_dir / ".hydra").is_dir() and not (sweep_dir / "multirun.yaml").exists():
        raise ReportError(
            f"report: '{sweep_dir}' is a single run, not a sweep; accepted: the folder of a multirun "
            "(multirun/<time>, holding multirun.yaml and one folder per job)"
        )
    jobs = sorted(p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml"))
    if not jobs:
        raise ReportError(f"report: '{sweep_dir}' holds no Hydra job folders (no */.hydra/overrides.yaml)")
    rows = [_read_job(job) for job in jobs]
    keys = sorted({k for row in rows for k in row.overrides})
    # A key is swept when the jobs that have it differ in it (a job without a key, e.g. one
    # whose overrides could not be read, makes no key swept).
    swept = [k for k in keys if len({row.overrides[k] for row in rows if k in row.overrides}) > 1] or keys
    return rows, swept


def _sort_key(row: JobRow) -> tuple[int, float, str]:
    rank = STATUSES.index(row.status) if row.status in STATUSES else len(STATUSES)
    loss = row.final_loss if math.isfinite(row.final_loss) else math.inf
    return (rank, loss, str(row.folder))


def counts_line(rows: list[JobRow]) -> str:
    """``jobs: 12 (9 finished, 1 diverged, 2 failed); 3 without a loss curve``."""
    statuses = [*STATUSES, *sorted({r.status for r in rows} - set(STATUSES))]
    counts = [f"{n} {status}" for status in statuses if (n := sum(r.status == status for r in rows))]
    line = f"jobs: {len(rows)} ({', '.join(counts)})"
    without = sum(not r.curve[0] for r in rows)
    return line + (f"; {without} without a loss curve" if without else "")


def _status_text(row: JobRow) -> str:
    """The table's status cell: the status, its detail, and why there is no loss curve."""
    text = row.status + (f" ({row.error})" if row.error else "")
    return text + (f"; {row.curve_note}" if row.curve_note and row.status != "unfinished" else "")


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def _cell(value: str) -> str:
    """A swept value in the printed table; ``-`` where the job has none."""
    return value if value else "-"


REPLICATE_KEY = "seed"
"""A swept key whose values are replicates of one setting, aggregated over."""


def _value_order(value: str) -> tuple[bool, float, str]:
    """Numbers in numeric order (inf last), then other values alphabetically."""
    number = _as_float(value)
    return (number is None, number if number is not None else 0.0, value)


@dataclasses.dataclass
class GroupRow:
    """The jobs that share the values of every swept key but the seed."""

    values: tuple[str, ...]
    rows: list[JobRow]

    @property
    def done(self) -> list[JobRow]:
        """The jobs that ran to the end (finished or diverged)."""
        return [r for r in self.rows if r.status in ("finished", "diverged")]

    @property
    def diverged(self) -> int:
        return sum(r.status == "diverged" for r in self.rows)

    def finite(self, field: str) -> list[float]:
        """The finite values of ``field`` over the jobs that ran to the end."""
        return [v for v in (getattr(r, field) for r in self.done) if math.isfinite(v)]

    def mean(self, field: str) -> float:
        values = self.finite(field)
        return float(np.mean(values)) if values else math.nan

    def std(self, field: str) -> float:
        values = self.finite(field)
        return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def aggregate(rows: list[JobRow], swept: list[str]) -> tuple[list[str], list[GroupRow]]:
    """Group the jobs over the replicate key (seed); groups sorted by their values."""
    keys = [k for k in swept if k != REPLICATE_KEY]
    groups: dict[tuple[str, ...], list[JobRow]] = {}
    for row in rows:
        groups.setdefault(tuple(row.overrides.get(k, "") for k in keys), []).append(row)
    ordered = sorted(groups, key=lambda values: [_value_order(v) for v in values])
    return keys, [GroupRow(values, groups[values]) for values in ordered]


def _by_value_table(keys: list[str], groups: list[GroupRow], sweep_dir: Path) -> list[str]:
    fields = ("final_loss_mean", "final_loss_std", "clipped_mean", "norm_pre_median", "diverged")
    stats = [
        (g.mean("final_loss"), g.std("final_loss"), g.mean("clipped_fraction"), g.mean("norm_pre_median"), g.diverged)
        for g in groups
    ]
    table = [
        [
            *g.values,
            f"{len(g.done)}/{len(g.rows)}",
            _fmt(mean, ".6g"),
            _fmt(std, ".2g"),
            _fmt(100 * clipped, ".0f") + ("%" if math.isfinite(clipped) else ""),
            _fmt(norm, ".3g"),
            str(diverged),
        ]
        for g, (mean, std, clipped, norm, diverged) in zip(groups, stats, strict=True)
    ]
    with atomic_output(sweep_dir / "report_by_value.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*keys, "seeds_done", "seeds", *fields])
        for g, values in zip(groups, stats, strict=True):
            writer.writerow([*g.values, len(g.done), len(g.rows), *values])
    return _columns([*keys, "seeds", *fields], table)


def _columns(header: list[str], table: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]


def report_sweep(sweep_dir: Path) -> str:
    """Write report.csv and report.png into ``sweep_dir``; return the table as text."""
    rows, swept = collect(sweep_dir)
    rows.sort(key=_sort_key)
    # A policy's whole episodes after training (the done line's figures), where a job has them.
    episodes = [
        (name, title, [getattr(row, name) for row in rows])
        for name, title in (("episode_return", "return"), ("upright", "upright"))
        if any(math.isfinite(getattr(row, name)) for row in rows)
    ]
    header = [*swept, *(title for _, title, _ in episodes), "final_loss", "best_loss", "clipped", "nonfinite"]
    header += ["wall_s", "status"]
    table = [
        [
            *(_cell(row.overrides.get(k, "")) for k in swept),
            *(_fmt(values[i], ".2f" if name == "upright" else ".4g") for name, _, values in episodes),
            _fmt(row.final_loss, ".6g"),
            _fmt(row.best_loss, ".6g"),
            _fmt(100 * row.clipped_fraction, ".0f") + ("%" if math.isfinite(row.clipped_fraction) else ""),
            _fmt(row.nonfinite_steps, ".0f"),
            _fmt(row.wall_time_s, ".1f"),
            _status_text(row),
        ]
        for i, row in enumerate(rows)
    ]
    with atomic_output(sweep_dir / "report.csv") as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        columns = ["final_loss", "best_loss", "clipped_fraction", "nonfinite_steps", "wall_time_s", "status"]
        writer.writerow([*swept, *(name for name, _, _ in episodes), *columns, "error", "curve_points", "folder"])
        for row in rows:
            writer.writerow(
                [
                    *(row.overrides.get(k, "") for k in swept),
                    *(getattr(row, name) for name, _, _ in episodes),
                    row.final_loss,
                    row.best_loss,
                    row.clipped_fraction,
                    row.nonfinite_steps,
                    row.wall_time_s,
                    row.status,
                    row.error,
                    len(row.curve[0]),
                    str(row.folder.relative_to(sweep_dir)),
                ]
            )
    keys, groups = aggregate(rows, swept)
    lines = _columns(header, table)
    written = [sweep_dir / "report.csv"]
    if REPLICATE_KEY in swept:
        lines += ["", f"per value, over {REPLICATE_KEY}s (mean and standard deviation of the finished ones):"]
        lines += _by_value_table(keys, groups, sweep_dir)
        written.append(sweep_dir / "report_by_value.csv")
    lines.append(counts_line(rows))
    try:
        _plot(rows, swept, keys, groups, sweep_dir / "report.png")
        written.append(sweep_dir / "report.png")
    except OutputError:
        raise
    except Exception as exc:  # the tables stand without the picture; say why it is missing
        lines.append(f"report.png not drawn ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    lines.append(f"wrote {', '.join(str(w) for w in written)}")
    return "\n".join(lines)


def _as_float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _plot(rows: list[JobRow], swept: list[str], keys: list[str], groups: list[GroupRow], path: Path) -> None:
    fig = report_figure(rows, swept, keys, groups)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=100)


def _spans_decades(values: list[float]) -> bool:
    """Whether ``values`` (the finite ones) are all positive and span a factor of 10 or more:
    worth a log axis."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) >= 10 * min(finite)


def _spread(values: list[float], mean: float) -> tuple[float, float]:
    """How far the smallest and the largest of ``values`` lie below and above ``mean``."""
    if not values or not math.isfinite(mean):
        return 0.0, 0.0
    return max(mean - min(values), 0.0), max(max(values) - mean, 0.0)


def _curves_title(rows: list[JobRow], gaps: int) -> str:
    """``loss curves of 9 of 12 jobs; none for 3: 2 failed, 1 unfinished``."""
    without = [row for row in rows if not row.curve[0]]
    title = f"loss curves of {len(rows) - len(without)} of {len(rows)} jobs"
    if without:
        statuses = [*STATUSES, *sorted({r.status for r in without} - set(STATUSES))]
        counts = [f"{n} {status}" for status in statuses if (n := sum(r.status == status for r in without))]
        title += f"; none for {len(without)}: {', '.join(counts)}"
    if gaps:
        title += f"; {gaps} with nan/inf values (gaps)"
    return title


def report_figure(rows: list[JobRow], swept: list[str], keys: list[str], groups: list[GroupRow]) -> Any:
    """The report's figure (a matplotlib ``Figure`` on its own Agg canvas; see the module docstring).

    The loss curves fill the top row, their legend outside the axes on the right; the three
    panels against the first swept key share one legend below them. Each setting's mark is
    the mean over its seeds and its bar runs from the smallest to the largest seed's value:
    a range stays on a log axis and within 0-100 % where mean +- std would not.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, MaxNLocator, PercentFormatter

    fig = Figure(figsize=(15, 10), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 3, height_ratios=(1.15, 1.0))
    curves = fig.add_subplot(grid[0, :])
    finals, clipped, norms = (fig.add_subplot(grid[1, i]) for i in range(3))
    # Colour: the first non-seed swept key; line style: the seed (or the other keys' values).
    key = keys[0] if keys else (swept[0] if swept else None)
    firsts = sorted({row.overrides.get(key, "") for row in rows}, key=_value_order)
    style_keys = [REPLICATE_KEY] if REPLICATE_KEY in swept and key != REPLICATE_KEY else keys[1:]
    styles_of = sorted(
        {tuple(row.overrides.get(k, "") for k in style_keys) for row in rows},
        key=lambda values: [_value_order(v) for v in values],
    )
    from matplotlib import colormaps

    palette = colormaps["viridis" if len(firsts) > 10 else "tab10"]

    def colour(value: str) -> Any:
        i = firsts.index(value)
        return palette(i / max(len(firsts) - 1, 1)) if len(firsts) > 10 else palette(i % 10)

    styles = ["-", "--", ":", "-."]
    gaps = 0  # curves with nan/inf points: drawn with a gap there
    for row in rows:
        steps, values = row.curve
        if steps:
            shown = np.asarray(values, dtype=float)
            gaps += not np.isfinite(shown).all()
            shown[~np.isfinite(shown)] = np.nan
            style = styles[styles_of.index(tuple(row.overrides.get(k, "") for k in style_keys)) % len(styles)]
            # A finite point with no finite neighbour (a run that went nan after one step) is a dot,
            # which a line alone would not show.
            finite = np.isfinite(shown)
            lonely = finite & ~np.r_[False, finite[:-1]] & ~np.r_[finite[1:], False]
            curves.plot(steps, shown, color=colour(row.overrides.get(key, "")), linestyle=style, linewidth=1.2,
                        marker="o", markersize=3, markevery=np.flatnonzero(lonely).tolist())  # fmt: skip
    drawn = [row for row in rows if row.curve[0]]

    def legend_label(value: str) -> str:  # the value, and the statuses of its curves other than finished
        others = sorted({r.status for r in drawn if r.overrides.get(key, "") == value} - {"finished"})
        return (f"{key}={value}" if value else f"{key} not set") + (f" ({', '.join(others)})" if others else "")

    handles = [
        Line2D([], [], color=colour(v), label=legend_label(v))
        for v in firsts
        if key is not None and any(row.overrides.get(key, "") == v for row in drawn)
    ]
    if len(styles_of) > 1:
        handles += [
            Line2D([], [], color="0.3", linestyle=styles[i % len(styles)],
                   label=", ".join(f"{k}={v}" for k, v in zip(style_keys, values, strict=True)))
            for i, values in enumerate(styles_of)
        ]  # fmt: skip
    # TensorBoard's step: iteration n is what the n-th iteration computed, counted from 1.
    curves.set_xlabel("iteration (TensorBoard step, from 1)")
    last = max((max(row.curve[0]) for row in rows if row.curve[0]), default=1)
    ticks = [t for t in MaxNLocator(integer=True, steps=[1, 2, 5, 10]).tick_values(1, last) if 1 < t <= last]
    curves.xaxis.set_major_locator(FixedLocator([1, *ticks]))  # the first iteration is 1, not 0
    curves.set_ylabel(tags.LOSS_TOTAL)
    curves.set_title(_curves_title(rows, gaps))
    curves.grid(alpha=0.3)
    if not drawn:
        curves.text(0.5, 0.5, "no job has a loss curve yet", ha="center", va="center", transform=curves.transAxes)
        curves.set_xlim(1, 2)
    if _spans_decades([v for row in rows for v in row.curve[1]]):
        curves.set_yscale("log")
    if handles:  # outside the axes, on the right: it covers no curve
        curves.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                      ncol=1 + len(handles) // 16, borderaxespad=0.0)  # fmt: skip

    xs = {g.values: _as_float(g.values[0]) if g.values else None for g in groups}
    numeric = [g for g in groups if xs[g.values] is not None and math.isfinite(xs[g.values])]
    unbounded = [g for g in groups if xs[g.values] is not None and not math.isfinite(xs[g.values])]
    panels = (
        (finals, "final_loss", "final loss"),
        (clipped, "clipped_fraction", "clipped fraction of steps"),
        (norms, "norm_pre_median", "median pre-clip gradient norm"),
    )
    replicated = REPLICATE_KEY in swept
    for ax, field, label in panels:
        ax.set_title(f"{label} vs {key}")
        if not numeric:
            why = f"only {REPLICATE_KEY}s are swept: the table gives their mean" if replicated and not keys else ""
            ax.text(0.5, 0.5, why or f"no numeric value of {key} to plot against", ha="center", va="center")
            continue
        gx = [xs[g.values] for g in numeric]
        finite = [v for g in groups for v in g.finite(field)]
        if not finite:  # every job failed, or none has finished yet: the axis still spans the values
            ax.text(0.5, 0.5, "no finished job with a finite value", ha="center", va="center", transform=ax.transAxes)
            ax.plot(gx, [0.0] * len(gx), linestyle="none")  # no mark: only the x range
        for g in numeric if finite else ():
            jobs = g.finite(field)
            ax.scatter([xs[g.values]] * len(jobs), jobs, s=14, color="0.6", zorder=2, label="each job")
        # One line per combination of the other swept keys: only equal settings are joined.
        rests = sorted({g.values[1:] for g in groups}, key=lambda v: [_value_order(x) for x in v])
        for i, rest in enumerate(rests):
            line = [g for g in numeric if g.values[1:] == rest]
            if not line or not finite:
                continue
            means = [g.mean(field) for g in line]
            spread = np.array([_spread(g.finite(field), m) for g, m in zip(line, means, strict=True)]).T
            what = f"mean over {REPLICATE_KEY}s, bar: smallest to largest" if replicated else "value"
            where = ", ".join(f"{k}={v}" for k, v in zip(keys[1:], rest, strict=True))
            ax.errorbar([xs[g.values] for g in line], means, yerr=spread if replicated else None, color=f"C{i}",
                        marker="o", capsize=3, zorder=3, label=f"{what}, {where}" if where else what)  # fmt: skip
        for g in unbounded:  # e.g. max_norm=inf: no position on the axis, a level to compare with
            level = g.mean(field)
            where = ", ".join(f"{k}={v}" for k, v in zip(keys[1:], g.values[1:], strict=True))
            shade = f"C{rests.index(g.values[1:])}" if len(rests) > 1 else "gray"  # its line's colour
            if math.isfinite(level):
                name = f"{key}={g.values[0]} (mean)" + (f", {where}" if where else "")
                ax.axhline(level, linestyle="--", color=shade, linewidth=1, label=name)
        placed = [xs[g.values] for g in numeric if g.finite(field)] or gx  # the values drawn on this panel
        if min(placed) > 0 and max(placed) / min(placed) >= 100:
            ax.set_xscale("log")
        if field == "norm_pre_median" and key is not None and "max_norm" in key:
            gx = [xs[g.values] for g in numeric if g.done] or gx  # not out to a value no job ran at
            ax.plot(gx, gx, color="tab:red", linestyle=":", label=f"{key} (clipping above)")
            finite += gx
        if field == "clipped_fraction":
            ax.set_ylim(-0.05, 1.05)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        elif _spans_decades(finite):
            ax.set_yscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    # One legend for the three panels, below them: the same marks mean the same in each.
    shared: dict[str, Any] = {}
    for ax, _, _ in panels:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            shared.setdefault(text, handle)
    if shared:
        fig.legend(list(shared.values()), list(shared), loc="outside lower center", ncol=min(len(shared), 4),
                   fontsize=9)  # fmt: skip
    return fig
