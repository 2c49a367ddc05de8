"""``python -m harness render RUN_DIR [checkpoint=PATH] [frames=N] [fps=N]``: see the simulated
system move, before and after training.

Rolls out a run's env twice, at the parameters training started from and at those of a
checkpoint (the newest by default), and writes into ``RUN_DIR/render/``:

- ``rollout.mp4``: both rollouts side by side (:mod:`harness.video`);
- ``rollout.png``: every per-step observable the loss reads (and the actions of an
  open-loop task) against time, before and after training (:mod:`harness.plots`);
- ``before.json`` / ``after.json``: the same frames as recordings of Newton's ``ViewerFile``,
  which Newton's viewers replay.

Only envs that play :class:`harness.env.Renderable` (a Newton model and its States) can be
drawn. Every file is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.commands.common import fail, run_folder_argument

__all__ = ["main", "render_run"]


def render_run(run_dir: Path, *, checkpoint: str | None = None, frames: int = 120, fps: int = 30) -> dict[str, Any]:
    """Render a run folder on the CPU (see the module docstring); returns what was written.

    Raises:
        harness.runs.RunError: One line: not a run folder, no checkpoint, an env that cannot be drawn.
    """
    import warp as wp

    from harness.build import trained_run
    from harness.env import Renderable
    from harness.plots import draw_plots, per_step_series
    from harness.runs import RunError, RunFolder, atomic_output
    from harness.video import Scene, draw_video, sample_frames, sample_steps, write_recording

    folder = RunFolder(run_dir, "render")
    trained = trained_run(folder, checkpoint_name=checkpoint, device="cpu", load=False)
    env, step = trained.run.env, trained.trainer.step
    if not isinstance(env, Renderable):
        raise RunError(f"render: env '{env.name}' does not play the role Renderable (no Newton model to draw)")
    params = step.params
    steps = sample_steps(env.horizon, frames)

    def snapshot() -> tuple[Any, dict[str, np.ndarray]]:
        shot, trajectory = sample_frames(env, step.task, params, steps)
        return shot, per_step_series(env.horizon, trajectory, params.numpy())

    before, before_values = snapshot()  # the parameters training started from
    trained.load()
    with step.at_eval_params():
        after, after_values = snapshot()

    out = Path(run_dir) / "render"
    out.mkdir(exist_ok=True)
    dt = float(env.dt)
    titles = ["before training", f"after {trained.checkpoint.iteration} iterations"]
    scene = Scene(env.model)
    targets = getattr(env, "targets", None)
    if isinstance(targets, wp.array) and targets.dtype == wp.vec3:
        scene.targets = targets.numpy().reshape(-1, 3)
    video = out / "rollout.mp4"
    with atomic_output(video) as tmp:
        count = draw_video(scene, [before, after], titles, dt, tmp, fps=fps)
    plot, panels = out / "rollout.png", []
    if after_values:  # envs whose losses read only the last step have nothing to plot against time
        with atomic_output(plot) as tmp:
            panels = draw_plots(before_values, after_values, dt, tmp, env.component_names())
    recordings = []
    for name, shot in (("before.json", before), ("after.json", after)):
        with atomic_output(out / name) as tmp:
            write_recording(env.model, shot, dt, tmp)
        recordings.append(str(out / name))
    return {
        "checkpoint": str(trained.checkpoint.path),
        "video": str(video),
        "frames": count,
        "plot": str(plot) if panels else None,
        "panels": panels,
        "recordings": recordings,
    }


def main(args: list[str]) -> None:
    """``render RUN_DIR [checkpoint=PATH] [frames=N] [fps=N]``: video, plots and Newton recordings."""
    from harness import init_warp
    from harness.runs import RunError

    try:
        run_dir, options, unknown = run_folder_argument(args, "render", ("checkpoint", "frames", "fps"))
    except ValueError as exc:
        fail(exc)
    if unknown:
        fail(f"render: unknown option '{unknown[0].partition('=')[0]}'; accepted: checkpoint=PATH, frames=N, fps=N")
    numbers = {}
    for key, default, least in (("frames", 120, 2), ("fps", 30, 1)):
        try:
            numbers[key] = int(options.get(key, default))
        except ValueError:
            numbers[key] = least - 1
        if numbers[key] < least:
            fail(f"render: {key} must be a whole number >= {least}, got {options[key]}")
    init_warp()
    try:
        written = render_run(run_dir, checkpoint=options.get("checkpoint"), **numbers)
    except RunError as exc:
        fail(exc)
    print(f"video: {written['video']} ({written['frames']} frames, before | after, from {written['checkpoint']})")
    if written["plot"]:
        print(f"plot: {written['plot']} ({', '.join(written['panels'])})")
    print(f"Newton ViewerFile recordings: {', '.join(written['recordings'])}")
