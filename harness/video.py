"""Pictures of a Newton simulation moving: positions sampled along a rollout, drawn as a video
and saved as recordings Newton's own viewers replay.

- :func:`sample_frames`: one rollout (no tape), the positions of the states asked for;
- :class:`Scene` and :func:`draw_video`: shapes as the outline of their projected corners,
  particles as dots, springs as lines, on the vertical plane that shows the most motion,
  encoded as H.264 with imageio's bundled ffmpeg (no display, OpenGL context or system
  package needed);
- :func:`write_recording`: the same frames as a recording of Newton's ``ViewerFile`` (JSON:
  it needs no further package), which Newton's viewers (``ViewerGL`` included) replay.

Only envs that play :class:`harness.env.Renderable` (a Newton model and its States) can be
drawn; ``python -m harness render`` (:mod:`harness.commands.render`) puts it together.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from harness.events import figure_rgb

__all__ = ["Frames", "Scene", "draw_video", "sample_frames", "sample_steps", "write_recording"]


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


def write_recording(model: Any, frames: Frames, dt: float, path: Path) -> None:
    """Write ``frames`` as a recording of Newton's ``ViewerFile`` (replayed by Newton's viewers)."""
    import contextlib
    import io

    import newton.viewer

    with contextlib.redirect_stdout(io.StringIO()):  # ViewerFile prints a line per save
        _log_frames(newton.viewer.ViewerFile(str(path), auto_save=False), model, frames, dt)


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
