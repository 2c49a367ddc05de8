"""``python -m harness report SWEEP_DIR``: compare the jobs of a Hydra multirun.

Reads every job folder of a sweep (the folders holding ``.hydra/overrides.yaml``): the
overrides that differ between jobs are the swept values; ``summary.json`` gives the
outcome; the TensorBoard events give the loss curve. Works on a sweep that is still
running or where jobs failed: such rows say ``unfinished`` or ``failed``.

Writes ``report.csv`` and ``report.png`` (loss curves of every job, and final loss
against the first swept value) into the sweep folder and returns the table as text,
sorted by final loss. A job stopped by SIGINT/SIGTERM (a scheduler's pre-emption) is
``interrupted``, with the iterations it completed. A finished job is marked ``diverged`` when its final loss is not
finite or above ``DIVERGED_FACTOR`` times its initial loss, or when any step had
non-finite gradients.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

DIVERGED_FACTOR = 2.0
"""A finished job whose final loss exceeds this multiple of its initial loss diverged."""


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


def _overrides(job: Path) -> dict[str, str]:
    lines = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
    parsed = OverridesParser.create().parse_overrides(lines)
    return {o.key_or_group: o.value() if isinstance(o.value(), str) else str(o.value()) for o in parsed}


def _loss_curve(job: Path) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not list(job.glob("events.out.tfevents.*")):
        return [], []
    acc = EventAccumulator(str(job), size_guidance={"scalars": 0})
    acc.Reload()
    if "loss/total" not in acc.Tags().get("scalars", []):
        return [], []
    events = acc.Scalars("loss/total")
    return [e.step for e in events], [e.value for e in events]


def _read_job(job: Path) -> JobRow:
    row = JobRow(folder=job, overrides=_overrides(job), status="unfinished", curve=_loss_curve(job))
    summary_path = job / "summary.json"
    if not summary_path.exists():
        return row
    try:
        summary = json.loads(summary_path.read_text())
    except json.JSONDecodeError:
        row.status, row.error = "failed", "summary.json is unreadable"
        return row
    if summary.get("status") == "failed":
        row.status, row.error = "failed", str(summary.get("error", ""))
        return row
    row.final_loss = float(summary["final_loss"])
    row.best_loss = float(summary["best_loss"])
    done = summary.get("iterations_done", summary["iterations"])
    row.clipped_fraction = summary["clipped_steps"] / max(done, 1)
    row.nonfinite_steps = float(summary["nonfinite_steps"])
    row.wall_time_s = float(summary["wall_time_s"])
    initial = float(summary["initial_loss"])
    diverged = (
        not math.isfinite(row.final_loss) or row.final_loss > DIVERGED_FACTOR * initial or row.nonfinite_steps > 0
    )
    if summary.get("status") == "interrupted":
        row.status = "interrupted"
        row.error = f"{summary.get('signal', 'signal')} after {done} of {summary['iterations']} iterations"
    else:
        row.status = "diverged" if diverged else "finished"
    return row


def collect(sweep_dir: Path) -> tuple[list[JobRow], list[str]]:
    """Every job of the sweep and the keys whose values differ between jobs."""
    if not sweep_dir.is_dir():
        raise ReportError(f"report: '{sweep_dir}' is not a folder")
    jobs = sorted(p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml"))
    if not jobs:
        raise ReportError(f"report: '{sweep_dir}' holds no Hydra job folders (no */.hydra/overrides.yaml)")
    rows = [_read_job(job) for job in jobs]
    keys = sorted({k for row in rows for k in row.overrides})
    swept = [k for k in keys if len({row.overrides.get(k) for row in rows}) > 1] or keys
    return rows, swept


def _sort_key(row: JobRow) -> tuple[int, float]:
    rank = {"finished": 0, "diverged": 1, "interrupted": 2, "unfinished": 3, "failed": 4}[row.status]
    loss = row.final_loss if math.isfinite(row.final_loss) else math.inf
    return (rank, loss)


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def report_sweep(sweep_dir: Path) -> str:
    """Write report.csv and report.png into ``sweep_dir``; return the table as text."""
    rows, swept = collect(sweep_dir)
    rows.sort(key=_sort_key)
    header = [*swept, "final_loss", "best_loss", "clipped", "nonfinite", "wall_s", "status"]
    table = [
        [
            *(row.overrides.get(k, "") for k in swept),
            _fmt(row.final_loss, ".6g"),
            _fmt(row.best_loss, ".6g"),
            _fmt(100 * row.clipped_fraction, ".0f") + ("%" if math.isfinite(row.clipped_fraction) else ""),
            _fmt(row.nonfinite_steps, ".0f"),
            _fmt(row.wall_time_s, ".1f"),
            row.status + (f" ({row.error})" if row.error else ""),
        ]
        for row in rows
    ]
    with open(sweep_dir / "report.csv", "w", newline="") as f:
        writer = csv.writer(f)
        columns = ["final_loss", "best_loss", "clipped_fraction", "nonfinite_steps", "wall_time_s", "status"]
        writer.writerow([*swept, *columns, "error", "folder"])
        for row in rows:
            writer.writerow(
                [
                    *(row.overrides.get(k, "") for k in swept),
                    row.final_loss,
                    row.best_loss,
                    row.clipped_fraction,
                    row.nonfinite_steps,
                    row.wall_time_s,
                    row.status,
                    row.error,
                    str(row.folder.relative_to(sweep_dir)),
                ]
            )
    _plot(rows, swept, sweep_dir / "report.png")
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lines.append(f"({len(rows)} jobs; wrote {sweep_dir / 'report.csv'} and {sweep_dir / 'report.png'})")
    return "\n".join(lines)


def _as_float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _plot(rows: list[JobRow], swept: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, finals) = plt.subplots(1, 2, figsize=(12, 4.5))
    # One colour per value of the first swept key, one line style per combination of the others.
    key = swept[0] if swept else None
    firsts = sorted({row.overrides.get(key, "") for row in rows}, key=lambda v: (_as_float(v) is None, _as_float(v), v))
    rests = sorted({tuple(row.overrides.get(k, "") for k in swept[1:]) for row in rows})
    colours = plt.get_cmap("viridis" if len(firsts) > 10 else "tab10")
    styles = ["-", "--", ":", "-."]
    labelled: set[str] = set()
    for row in rows:
        steps, values = row.curve
        if not steps:
            continue
        first = row.overrides.get(key, "")
        i = firsts.index(first)
        colour = colours(i / max(len(firsts) - 1, 1)) if len(firsts) > 10 else colours(i % 10)
        style = styles[rests.index(tuple(row.overrides.get(k, "") for k in swept[1:])) % len(styles)]
        label = f"{key}={first}" if key is not None and first not in labelled else None
        labelled.add(first)
        curves.plot(steps, values, color=colour, linestyle=style, label=label)
    curves.set_xlabel("iteration")
    curves.set_ylabel("loss/total")
    curves.set_title("loss curves" + (f" (line style: {', '.join(swept[1:])})" if len(swept) > 1 else ""))
    if any(v > 0 for row in rows for v in row.curve[1]):
        curves.set_yscale("log")
    if any(row.curve[0] for row in rows):
        curves.legend(fontsize=7)

    points = [
        (_as_float(row.overrides.get(key)), row.final_loss, row.status)
        for row in rows
        if key is not None and math.isfinite(row.final_loss)
    ]
    numeric = [(x, y, s) for x, y, s in points if x is not None and math.isfinite(x)]
    unbounded = [(x, y) for x, y, _ in points if x is not None and not math.isfinite(x)]
    if numeric:
        for status, marker in (("finished", "o"), ("diverged", "x")):
            xs = [x for x, _, s in numeric if s == status]
            ys = [y for _, y, s in numeric if s == status]
            if xs:
                finals.scatter(xs, ys, marker=marker, label=status)
        for x, y in unbounded:  # e.g. max_norm=inf: no position on the axis, a level to compare with
            finals.axhline(y, linestyle="--", color="gray", linewidth=1)
            finals.annotate(f"{key}={x:g}", (0.01, y), xycoords=("axes fraction", "data"), fontsize=7)
        xs = [x for x, _, _ in numeric]
        if min(xs) > 0 and max(xs) / min(xs) >= 100:
            finals.set_xscale("log")
        if all(y > 0 for _, y, _ in numeric) and all(y > 0 for _, y in unbounded):
            finals.set_yscale("log")
        finals.set_xlabel(key)
        finals.legend(fontsize=7)
    else:
        finals.text(0.5, 0.5, "no finished job with a numeric swept value", ha="center", va="center")
    finals.set_ylabel("final loss")
    finals.set_title("final loss vs " + (key or "job"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
