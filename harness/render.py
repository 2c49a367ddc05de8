"""``python -m harness render RUN_DIR``: see the simulated system move, before and after training.

Rolls out a run's env twice, at the parameters training started from and at those of a
checkpoint (the newest by default), and writes into ``RUN_DIR/render/``:

- ``rollout.mp4``: both rollouts side by side, drawn from Newton's own body and particle
  positions (shapes as the outline of their projected corners, particles as dots, springs
  as lines) on the vertical plane that shows the most motion, encoded with imageio's
  bundled ffmpeg. No display, OpenGL context or system package is needed.
- ``rollout.png``: every per-step observable the loss reads (and the actions of an
  open-loop task) against time, before and after training.
- ``before.json`` / ``after.json``: the same frames as recordings of Newton's
  ``ViewerFile``, which Newton's viewers replay (``ViewerGL`` included) on a machine that has
  one. JSON rather than the binary format: it needs no further package.

Only envs built on :class:`harness.newton_env.NewtonEnv` (a Newton model and its States)
can be drawn.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from harness.events import figure_rgb


class RenderError(ValueError):
    """Bad input to ``render``: one line naming the argument and what is accepted."""


@dataclasses.dataclass
class Frames:
    """Positions sampled along one rollout.

    Attributes:
        steps: The sampled step indices (state after ``steps[k]`` steps).
        body_q: ``(frames, bodies, 7)`` body transforms (position, quaternion xyzw), or None.
        particle_q: ``(frames, particles, 3)`` particle positions, or None.
    """

    steps: list[int]
    body_q: np.ndarray | None
    particle_q: np.ndarray | None


def sample_steps(horizon: int, frames: int) -> list[int]:
    """At most ``frames`` state indices from 0 to ``horizon``, evenly spread, both ends included."""
    return sorted({round(float(x)) for x in np.linspace(0, horizon, max(2, min(frames, horizon + 1)))})


def record_frames(env: Any, task: Any, params: Any, steps: list[int]) -> tuple[Frames, Any]:
    """Roll out once (no tape) and copy the positions of the states in ``steps``.

    Returns:
        The frames and the rollout's trajectory (device arrays).
    """
    import newton

    from harness.tasks import rollout

    model = env.model
    wanted = set(steps)
    bodies: list[np.ndarray] = []
    particles: list[np.ndarray] = []
    # Body poses from the joint coordinates (forward kinematics): a reduced-coordinate
    # solver's initial State holds joint_q only, its body_q is not yet computed.
    posed = model.state() if model.joint_count else None

    def grab(state: Any) -> None:
        if posed is not None:
            newton.eval_fk(model, state.joint_q, state.joint_qd, posed)
            bodies.append(posed.body_q.numpy().copy())
        elif model.body_count:
            bodies.append(state.body_q.numpy().copy())
        if model.particle_count:
            particles.append(state.particle_q.numpy().copy())

    def after_step(t: int, _arrays: Any) -> None:
        if t == 0 and 0 in wanted:  # the initial state as the task set it (still intact after step 0)
            grab(env.state(0))
        if t + 1 in wanted:
            grab(env.state(t + 1))

    trajectory = rollout(env, task, params, after_step=after_step)
    return (
        Frames(
            steps=steps,
            body_q=np.stack(bodies) if bodies else None,
            particle_q=np.stack(particles) if particles else None,
        ),
        trajectory,
    )


# -- geometry ------------------------------------------------------------------------------


def _rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate points ``v`` (n, 3) by the unit quaternion ``q`` = (x, y, z, w)."""
    u, w = q[:3], q[3]
    return v + 2.0 * np.cross(u, np.cross(u, v) + w * v)


def _local_points(kind: int, scale: np.ndarray) -> np.ndarray | None:
    """Points whose projected outline is the shape's silhouette (Newton's shape frames:
    boxes by half extents, capsules and cylinders along local z)."""
    from newton import GeoType

    if kind == GeoType.BOX:
        corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)
        return corners * scale[:3]
    ring = np.linspace(0.0, 2.0 * np.pi, 16, endpoint=False)
    circle = np.stack([np.cos(ring), np.sin(ring), np.zeros_like(ring)], axis=1)
    ball = np.concatenate([circle, circle[:, [0, 2, 1]], circle[:, [2, 0, 1]]])
    if kind == GeoType.SPHERE:
        return ball * scale[0]
    if kind == GeoType.ELLIPSOID:
        return ball * scale[:3]
    if kind in (GeoType.CAPSULE, GeoType.CYLINDER, GeoType.CONE):
        r, h = scale[0], scale[1]
        end = ball * r if kind == GeoType.CAPSULE else circle * r
        offset = np.array([0.0, 0.0, h])
        return np.concatenate([end + offset, end - offset])
    return None


def _hull(points: np.ndarray) -> np.ndarray:
    """Convex hull of 2-D points (Andrew's monotone chain), counter-clockwise."""
    pts = sorted(set(map(tuple, np.round(points, 9))))
    if len(pts) <= 2:
        return np.asarray(pts)

    def half(seq: list) -> list:
        out: list = []
        for p in seq:
            while (
                len(out) >= 2
                and ((out[-1][0] - out[-2][0]) * (p[1] - out[-2][1]) - (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0]))
                <= 0
            ):
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(pts[::-1])
    return np.asarray(lower[:-1] + upper[:-1])


class Scene:
    """What to draw of a Newton model, and how to project it onto a vertical plane."""

    def __init__(self, model: Any):
        import newton

        self.up = int(model.up_axis)
        kinds = model.shape_type.numpy() if model.shape_count else np.zeros(0, int)
        self.ground = bool((kinds == int(newton.GeoType.PLANE)).any())
        self.shapes: list[tuple[int, np.ndarray]] = []  # (body, the shape's points in the body's frame)
        if model.shape_count:
            bodies = model.shape_body.numpy()
            xforms = model.shape_transform.numpy()
            scales = model.shape_scale.numpy()
            for body, xform, kind, scale in zip(bodies, xforms, kinds, scales, strict=True):
                local = _local_points(int(kind), np.asarray(scale, dtype=float))
                if local is None:
                    continue
                points = _rotate(np.asarray(xform[3:7], dtype=float), local) + xform[:3]
                self.shapes.append((int(body), points))
        springs = getattr(model, "spring_indices", None)
        self.springs = springs.numpy().reshape(-1, 2) if springs is not None and springs.shape[0] else None
        self.across = 0 if self.up != 0 else 1  # horizontal axis, chosen by :meth:`fit`
        self.targets: np.ndarray | None = None  # (n, 3) points drawn as crosses

    def world_points(self, frames: Frames, k: int) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Shape point clouds and particle positions of frame ``k``, in world coordinates."""
        clouds = []
        for body, points in self.shapes:
            if body < 0:
                clouds.append(points)
            elif frames.body_q is not None:
                q = frames.body_q[k, body]
                clouds.append(_rotate(np.asarray(q[3:7], dtype=float), points) + q[:3])
        particles = frames.particle_q[k] if frames.particle_q is not None else None
        return clouds, particles

    def fit(self, runs: list[Frames]) -> tuple[tuple[float, float], tuple[float, float]]:
        """Choose the horizontal axis with the most spread and return the plot limits."""
        everything = []
        for frames in runs:
            for k in range(len(frames.steps)):
                clouds, particles = self.world_points(frames, k)
                everything += clouds
                if particles is not None:
                    everything.append(particles)
        if self.targets is not None:
            everything.append(self.targets)
        allpts = np.concatenate(everything) if everything else np.zeros((1, 3))
        others = [a for a in range(3) if a != self.up]
        self.across = max(others, key=lambda a: np.ptp(allpts[:, a]))
        x, y = allpts[:, self.across], allpts[:, self.up]
        lo_y = min(float(y.min()), 0.0) if self.ground else float(y.min())
        pad = 0.05 * max(float(np.ptp(x)), float(y.max()) - lo_y, 1e-3)
        return (float(x.min()) - pad, float(x.max()) + pad), (lo_y - pad, float(y.max()) + pad)


AXIS_NAMES = "xyz"


def draw_video(scene: Scene, runs: list[Frames], titles: list[str], dt: float, path: Path, *, fps: int) -> int:
    """Encode the frames of ``runs`` side by side into ``path`` (H.264); returns the frame count."""
    import imageio.v2 as imageio
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Polygon

    xlim, ylim = scene.fit(runs)
    aspect = (ylim[1] - ylim[0]) / max(xlim[1] - xlim[0], 1e-9)
    width = 6.4 * len(runs)  # inches at 100 dpi: 640 px per panel
    height = round((float(np.clip(6.4 * aspect, 2.4, 7.2)) + 0.8) * 100 / 16) * 16 / 100  # H.264 wants 16 px blocks
    fig, axes = plt.subplots(1, len(runs), figsize=(width, height), dpi=100, squeeze=False)
    count = len(runs[0].steps)
    with imageio.get_writer(path, fps=fps, codec="libx264", quality=8, macro_block_size=16) as writer:
        for k in range(count):
            for ax, frames, title in zip(axes[0], runs, titles, strict=True):
                ax.clear()
                ax.set_xlim(*xlim)
                ax.set_ylim(*ylim)
                ax.set_aspect("equal", adjustable="box")
                ax.set_xlabel(f"{AXIS_NAMES[scene.across]} [m]")
                ax.set_ylabel(f"{AXIS_NAMES[scene.up]} [m] (up)")
                ax.set_title(f"{title}   t = {frames.steps[k] * dt:.3f} s (step {frames.steps[k]})")
                if scene.ground:
                    ax.axhline(0.0, color="0.4", linewidth=1.0)
                if scene.targets is not None:
                    ax.scatter(scene.targets[:, scene.across], scene.targets[:, scene.up], marker="x", s=60,
                               color="tab:green", zorder=4, label="target")  # fmt: skip
                clouds, particles = scene.world_points(frames, k)
                for cloud in clouds:
                    outline = _hull(cloud[:, [scene.across, scene.up]])
                    if len(outline) >= 3:
                        ax.add_patch(Polygon(outline, closed=True, facecolor="tab:blue", edgecolor="navy", alpha=0.5))
                if particles is not None:
                    px, py = particles[:, scene.across], particles[:, scene.up]
                    if scene.springs is not None:
                        for i, j in scene.springs:
                            ax.plot([px[i], px[j]], [py[i], py[j]], color="0.5", linewidth=0.8)
                    ax.scatter(px, py, s=max(2.0, 60.0 / np.sqrt(len(px))), color="tab:red", zorder=3)
            fig.tight_layout()
            writer.append_data(figure_rgb(fig))
    plt.close(fig)
    return count


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
) -> list[str]:
    """One panel per observable component: before (dashed) and after training (solid) against time.

    Args:
        before, after: By series name, ``(steps, worlds, dim)`` (:func:`per_step_series`).
        names: Optional names of an observable's components (the env's ``component_names``).

    Returns:
        The panel titles, in order (none, and no file, without per-step series).
    """
    figure = SeriesFigure(after, dt, names)
    if figure.figure is None:
        return []
    figure.draw(before, after, ("before training", "after training"))
    figure.figure.savefig(path)
    return figure.titles


def write_recording(model: Any, frames: Frames, dt: float, path: Path) -> None:
    """Write ``frames`` as a recording of Newton's ``ViewerFile`` (replayed by Newton's viewers)."""
    import contextlib
    import io

    import newton.viewer

    with contextlib.redirect_stdout(io.StringIO()):  # ViewerFile prints a line per save
        _record(newton.viewer.ViewerFile(str(path), auto_save=False), model, frames, dt)


def _record(viewer: Any, model: Any, frames: Frames, dt: float) -> None:
    viewer.set_model(model)
    state = model.state()
    for k, step in enumerate(frames.steps):
        if frames.body_q is not None:
            state.body_q.assign(frames.body_q[k])
        if frames.particle_q is not None:
            state.particle_q.assign(frames.particle_q[k])
        viewer.begin_frame(step * dt)
        viewer.log_state(state)
        viewer.end_frame()
    viewer.close()


def render_run(run_dir: Path, *, checkpoint: str | None = None, frames: int = 120, fps: int = 30) -> dict[str, Any]:
    """Render a run folder on the CPU (see the module docstring); returns what was written.

    Raises:
        RenderError: One line: not a run folder, no checkpoint, an env that cannot be drawn.
    """
    import warp as wp

    from harness import checkpoint as ckpt
    from harness import config
    from harness.newton_env import NewtonEnv
    from harness.training.callbacks import check_identity

    try:
        overrides = config.run_overrides(run_dir, "render")
    except config.ConfigError as exc:
        raise RenderError(str(exc)) from None
    try:
        path = ckpt.resolve(checkpoint or "auto", run_dir, field="checkpoint")
    except ckpt.CheckpointError as exc:
        raise RenderError(str(exc)) from None
    if path is None:
        raise RenderError(
            f"render: no checkpoint in '{run_dir / 'checkpoints'}'; accepted: a finished or interrupted run"
        )
    try:
        cfg, choices = config.compose_config("train", [*overrides, "device=cpu"])
        run = config.build_run(cfg, choices, evaluation=True)  # a windowed policy: its whole episode
    except config.ConfigError as exc:
        raise RenderError(f"render: the run's config: {exc}") from None
    env = run.env
    if not isinstance(env, NewtonEnv):
        raise RenderError(f"render: env '{env.name}' is not a NewtonEnv (no Newton model to draw)")
    trainer = run.trainer()
    step = trainer.step
    params = step.state.params
    steps = sample_steps(env.horizon, frames)

    def snapshot() -> tuple[Frames, dict[str, np.ndarray]]:
        shot, trajectory = record_frames(env, step.task, params, steps)
        return shot, per_step_series(env.horizon, trajectory, params.numpy())

    try:  # the checks a resume makes: the same env, parameter layout and components
        saved = ckpt.load(path, field="checkpoint")
        check_identity(saved, path, step, field="checkpoint")
    except ckpt.CheckpointError as exc:
        raise RenderError(str(exc)) from None
    before, before_values = snapshot()
    try:
        # a windowed policy's checkpoint also holds the state its training carried between
        # windows; a render rolls whole episodes from the env's own starts and needs none of it
        mine = step.state.arrays()
        step.state.load({k: v for k, v in saved.arrays.items() if not k.startswith("task/") or k in mine})
    except ValueError as exc:
        raise RenderError(f"checkpoint: '{path}' does not fit this run ({exc})") from None
    with step.at_eval_params():
        after, after_values = snapshot()

    out = run_dir / "render"
    out.mkdir(exist_ok=True)
    dt = float(env.dt)
    titles = ["before training", f"after {saved.iteration} iterations"]
    video = out / "rollout.mp4"
    scene = Scene(env.model)
    targets = getattr(env, "targets", None)
    if isinstance(targets, wp.array) and targets.dtype == wp.vec3:
        scene.targets = targets.numpy().reshape(-1, 3)
    count = draw_video(scene, [before, after], titles, dt, video, fps=fps)
    plot = out / "rollout.png"
    panels = draw_plots(before_values, after_values, dt, plot, env.component_names())
    write_recording(env.model, before, dt, out / "before.json")
    write_recording(env.model, after, dt, out / "after.json")
    return {
        "checkpoint": str(path),
        "video": str(video),
        "frames": count,
        "plot": str(plot) if panels else None,
        "panels": panels,
        "recordings": [str(out / "before.json"), str(out / "after.json")],
    }
