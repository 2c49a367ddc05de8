"""Pictures of a Newton simulation moving: positions sampled along a rollout, drawn as a video
and saved as recordings Newton's own viewers replay.

- :func:`sample_frames`: one rollout (no tape), the positions of the states asked for;
- :func:`real_time_frames`, :func:`playback_speed`: how many states to draw for a playback
  speed (real time by default), and the speed a choice of states makes;
- :class:`Scene` and :func:`draw_video`: shapes as the outline of their projected corners,
  particles as dots, springs as lines, on the vertical plane that shows the most motion, one
  panel and colour per run (static shapes grey), the simulated time and the playback speed
  on every frame, encoded as H.264 with imageio's bundled ffmpeg (no display, OpenGL context
  or system package needed);
- :func:`write_recording`: the same frames as a recording of Newton's ``ViewerFile`` (JSON:
  it needs no further package), which Newton's viewers (``ViewerGL`` included) replay.

Both files are written under a temporary name and renamed when complete
(:func:`harness.runs.atomic_output`): a killed render leaves the previous ones as they were.

Only envs that play :class:`harness.env.Renderable` (a Newton model and its States) can be
drawn; ``python -m harness render`` (:mod:`harness.commands.render`) puts it together.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Frames",
    "Scene",
    "draw_video",
    "hull",
    "playback_speed",
    "real_time_frames",
    "sample_frames",
    "sample_steps",
    "speed_text",
    "write_recording",
]


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


def sample_frames(env: Any, task: Any, params: Any, steps: list[int]) -> tuple[Frames, Any]:
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

    offsets = getattr(env, "body_offsets", lambda _state: None)  # Renderable.body_offsets: moved worlds

    def grab(state: Any) -> None:
        if posed is not None:
            newton.eval_fk(model, state.joint_q, state.joint_qd, posed)
            frame = posed.body_q.numpy().copy()
        elif model.body_count:
            frame = state.body_q.numpy().copy()
        if model.body_count:
            shift = offsets(state)
            if shift is not None:
                frame[:, :3] += shift
            bodies.append(frame)
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


def hull(points: np.ndarray) -> np.ndarray:
    """Convex hull of 2-D points (Andrew's monotone chain), counter-clockwise: the outline a body
    is drawn with (here and in ``scripts/plot_gait.py``)."""
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

    def world_points(self, frames: Frames, k: int) -> tuple[list[tuple[int, np.ndarray]], np.ndarray | None]:
        """Shape point clouds (each with its body, -1 for a static shape) and particle positions
        of frame ``k``, in world coordinates."""
        clouds = []
        for body, points in self.shapes:
            if body < 0:
                clouds.append((body, points))
            elif frames.body_q is not None:
                q = frames.body_q[k, body]
                clouds.append((body, _rotate(np.asarray(q[3:7], dtype=float), points) + q[:3]))
        particles = frames.particle_q[k] if frames.particle_q is not None else None
        return clouds, particles

    def fit(self, runs: list[Frames]) -> tuple[tuple[float, float], tuple[float, float]]:
        """Choose the horizontal axis with the most spread and return the plot limits."""
        everything = []
        for frames in runs:
            for k in range(len(frames.steps)):
                clouds, particles = self.world_points(frames, k)
                everything += [cloud for _, cloud in clouds]
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

RUN_COLOURS = ("tab:orange", "tab:blue")
"""Fill colours of the runs drawn, in order (before training, after training)."""

MAX_FRAMES = 600
"""Most frames :func:`real_time_frames` asks for (20 s of video at 30 fps): a longer horizon
plays faster than real time, and the frame says how fast."""


def real_time_frames(horizon: int, dt: float, fps: float, speed: float = 1.0, *, cap: int | None = MAX_FRAMES) -> int:
    """How many states to draw so that a video at ``fps`` plays ``horizon`` steps of ``dt`` at
    ``speed`` times real time (1: one simulated second per second of video): one frame per
    ``speed / fps`` simulated seconds, the start and the end included; at most the ``horizon + 1``
    states there are, and at most ``cap``."""
    frames = round(horizon * dt * fps / speed) + 1
    return max(2, min(frames, horizon + 1, cap or frames))


def playback_speed(steps: list[int], dt: float, fps: float) -> float:
    """Simulated seconds per second of video when the states after ``steps`` play at ``fps``."""
    return (steps[-1] - steps[0]) * dt * fps / max(len(steps) - 1, 1)


def speed_text(speed: float) -> str:
    """``1x real time``, ``0.25x real time (slow motion)``, ``2x real time (fast)``."""
    text = f"{speed:.2g}x real time"
    if speed < 0.995:
        text += " (slow motion)"
    elif speed > 1.005:
        text += " (fast)"
    return text


# Panel margins [inches]: y label and ticks, right edge, x label and ticks, panel title;
# the header line (time and playback speed) above the panels.
_LEFT, _RIGHT, _BOTTOM, _TOP, _HEADER = 0.75, 0.2, 0.55, 0.35, 0.45
_WIDTH, _MAX_HEIGHT, _MIN_PANEL = 12.8, 7.2, 1.2  # 1280 px wide, at most 720 px tall, at 100 dpi


def _layout(xlim: tuple[float, float], ylim: tuple[float, float], panels: int) -> tuple[int, int, float]:
    """Panels side by side or stacked, whichever draws the scene larger in a frame 1280 px
    wide and at most 720 px tall; returns (rows, columns, inches per metre)."""
    dx, dy = max(xlim[1] - xlim[0], 1e-9), max(ylim[1] - ylim[0], 1e-9)
    best = (1, panels, 0.0)
    for rows, cols in ((1, panels), (panels, 1)):
        width = _WIDTH / cols - _LEFT - _RIGHT
        height = (_MAX_HEIGHT - _HEADER) / rows - _BOTTOM - _TOP
        scale = min(width / dx, height / dy)
        if scale > best[2] * 1.01:
            best = (rows, cols, scale)
    return best


def draw_video(
    scene: Scene,
    runs: list[Frames],
    titles: list[str],
    dt: float,
    path: Path,
    *,
    fps: float,
    colours: tuple[str, ...] = RUN_COLOURS,
) -> tuple[int, str]:
    """Encode the frames of ``runs`` into ``path`` (H.264), one panel per run, side by side or
    stacked (whichever draws the scene larger), each in its colour under its title; every frame
    says the simulated time and the playback speed. Returns the frame count and the layout
    (``side by side`` or ``stacked``)."""
    import imageio.v2 as imageio
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgb
    from matplotlib.figure import Figure
    from matplotlib.patches import Polygon

    from harness.events import figure_rgb
    from harness.runs import atomic_output

    xlim, ylim = scene.fit(runs)
    rows, cols, scale = _layout(xlim, ylim, len(runs))
    # Fill the panel's width (more of the scene around it), its height as the scene needs.
    box_w = _WIDTH / cols - _LEFT - _RIGHT
    box_h = max((ylim[1] - ylim[0]) * scale, _MIN_PANEL)
    mid_x, mid_y = sum(xlim) / 2, sum(ylim) / 2
    xlim = (mid_x - box_w / scale / 2, mid_x + box_w / scale / 2)
    ylim = (mid_y - box_h / scale / 2, mid_y + box_h / scale / 2)
    cell_h = box_h + _BOTTOM + _TOP
    height = math.ceil(round((_HEADER + rows * cell_h) * 100 / 16, 6)) * 16 / 100  # H.264 wants 16 px blocks
    fig = Figure(figsize=(_WIDTH, height), dpi=100)
    FigureCanvasAgg(fig)
    axes = []
    for i in range(len(runs)):
        row, col = (i, 0) if rows > 1 else (0, i)
        left = col * _WIDTH / cols + _LEFT
        bottom = height - _HEADER - (row + 1) * cell_h + _BOTTOM
        axes.append(fig.add_axes((left / _WIDTH, bottom / height, box_w / _WIDTH, box_h / height)))
    clock = fig.text(_LEFT / _WIDTH, 1 - 0.3 / height, "", fontsize=13, weight="bold", va="baseline")
    rate = fig.text(1 - _RIGHT / _WIDTH, 1 - 0.3 / height, "", fontsize=11, ha="right", va="baseline")
    steps = runs[0].steps
    horizon_s = steps[-1] * dt
    speed = playback_speed(steps, dt, fps)
    rate.set_text(f"playback: {speed_text(speed)}, {fps:g} fps")
    count = len(steps)
    with (
        atomic_output(path) as tmp,  # a killed command leaves the previous video as it was
        imageio.get_writer(tmp, fps=fps, codec="libx264", quality=8, macro_block_size=16) as writer,
    ):
        for k in range(count):
            clock.set_text(f"t = {steps[k] * dt:.3f} s of {horizon_s:.3f} s   (step {steps[k]} of {steps[-1]})")
            for ax, frames, title, colour in zip(axes, runs, titles, colours, strict=False):
                dark = tuple(0.7 * c for c in to_rgb(colour))
                ax.clear()
                ax.set_xlim(*xlim)
                ax.set_ylim(*ylim)
                ax.set_xlabel(f"{AXIS_NAMES[scene.across]} [m]")
                ax.set_ylabel(f"{AXIS_NAMES[scene.up]} [m] (up)")
                ax.set_title(title, color=dark, weight="bold", fontsize=11)
                for spine in ax.spines.values():
                    spine.set_color(colour)
                    spine.set_linewidth(2.0)
                if scene.ground:
                    ax.axhline(0.0, color="0.4", linewidth=1.0)
                if scene.targets is not None:
                    ax.scatter(scene.targets[:, scene.across], scene.targets[:, scene.up], marker="x", s=60,
                               color="tab:green", zorder=4, label="target")  # fmt: skip
                clouds, particles = scene.world_points(frames, k)
                for body, cloud in clouds:
                    outline = hull(cloud[:, [scene.across, scene.up]])
                    if len(outline) < 3:
                        continue
                    if body < 0:  # static: the same in every run
                        ax.add_patch(Polygon(outline, closed=True, facecolor="0.85", edgecolor="0.5"))
                    else:
                        ax.add_patch(Polygon(outline, closed=True, facecolor=colour, edgecolor=dark, alpha=0.8))
                if particles is not None:
                    px, py = particles[:, scene.across], particles[:, scene.up]
                    if scene.springs is not None:
                        for i, j in scene.springs:
                            ax.plot([px[i], px[j]], [py[i], py[j]], color="0.6", linewidth=0.8)
                    ax.scatter(px, py, s=max(2.0, 60.0 / np.sqrt(len(px))), color=colour, zorder=3)
            writer.append_data(figure_rgb(fig))
    return count, "stacked" if rows > 1 else "side by side"


def write_recording(model: Any, frames: Frames, dt: float, path: Path) -> None:
    """Write ``frames`` as a recording of Newton's ``ViewerFile`` (replayed by Newton's viewers),
    atomically (:func:`harness.runs.atomic_output`)."""
    import contextlib
    import io

    import newton.viewer

    from harness.runs import atomic_output

    with atomic_output(path) as tmp, contextlib.redirect_stdout(io.StringIO()):  # ViewerFile prints a line per save
        _log_frames(newton.viewer.ViewerFile(str(tmp), auto_save=False), model, frames, dt)


def _log_frames(viewer: Any, model: Any, frames: Frames, dt: float) -> None:
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
