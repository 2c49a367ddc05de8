"""``python -m harness render RUN_DIR [checkpoint=PATH] [fps=N] [speed=X | frames=N]``: see the
simulated system move, before and after training.

Rolls out a run's env twice, at the parameters training started from and at those of a
checkpoint (the newest by default), and writes into ``RUN_DIR/render/``:

- ``rollout.mp4``: both rollouts, side by side or stacked (whichever draws the scene
  larger), before training in orange and after in blue, each under its label, every frame
  with the simulated time and the playback speed (:mod:`harness.video`). It plays in real
  time by default: one frame per ``1/fps`` simulated seconds (``fps=30``), at most
  :data:`harness.video.MAX_FRAMES` frames (a longer rollout plays faster, and says so);
  ``speed=0.25`` plays it at a quarter of real time, ``frames=N`` draws N states evenly
  spread over the rollout (at whatever speed that makes);
- ``rollout.png``: every per-step observable the loss reads (and the actions of an
  open-loop task) against time, before and after training (:mod:`harness.plots`);
- ``before.json`` / ``after.json``: the same frames as recordings of Newton's ``ViewerFile``,
  which Newton's viewers replay.

A controller's run (``task=mpc``) is run again from its start and its real system drawn over its
frames instead (one panel, ``rollout.mp4``, and the recording ``flight.json``).

Only envs that play :class:`harness.env.Renderable` (a Newton model and its States) can be
drawn. Every file is written under a temporary name and renamed when complete
(:func:`harness.runs.atomic_output`), so a killed render leaves the previous files as they
were; a destination that cannot be written (a folder named ``rollout.mp4``, a read-only
``render/``) is refused in one line before the rollouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.commands.common import collector_paused, fail, run_folder_argument

__all__ = ["OUTPUTS", "main", "render_run"]

OUTPUTS = ("rollout.mp4", "rollout.png", "before.json", "after.json")


def render_run(
    run_dir: Path,
    *,
    checkpoint: str | None = None,
    frames: int | None = None,
    fps: int = 30,
    speed: float | None = None,
) -> dict[str, Any]:
    """Render a run folder on the CPU (see the module docstring); returns what was written.

    Args:
        frames: States to draw, evenly spread over the rollout; by default as many as
            ``speed`` needs.
        fps: Frames per second of the video.
        speed: Playback speed, simulated seconds per second of video (1: real time, the
            default, up to :data:`harness.video.MAX_FRAMES` frames; given, not capped).

    Raises:
        harness.runs.RunError: One line: not a run folder, no checkpoint, an env that cannot be drawn,
            a destination that cannot be written (:class:`harness.runs.OutputError`).
    """
    from harness.runs import OutputError, RunError, RunFolder, check_writable

    folder = RunFolder(run_dir, "render")  # a folder without a run is refused before Warp is imported
    out = Path(run_dir) / "render"
    if out.exists() and not out.is_dir():
        raise OutputError(f"render: cannot write into '{out}': it is a file, not a folder")
    for name in OUTPUTS if out.is_dir() else ():  # refused before the rollouts, not after
        try:
            check_writable(out / name)
        except OutputError as exc:
            raise OutputError(f"render: {exc}") from None
    import warp as wp

    from harness.build import trained_run
    from harness.env import Renderable
    from harness.plots import draw_plots, per_step_series
    from harness.video import (
        MAX_FRAMES,
        Scene,
        draw_video,
        playback_speed,
        real_time_frames,
        sample_frames,
        sample_steps,
        write_recording,
    )

    with collector_paused():  # Newton's import and the env's build: docs/startup.md
        from harness.build import check_evaluation_memory  # refused before anything is allocated

        check_evaluation_memory(folder, [], device="cpu")
        trained = trained_run(folder, checkpoint_name=checkpoint, device="cpu", load=False)
    env, step = trained.run.env, trained.trainer.step
    if step.task.replays:  # a controller's run is a flight: draw the real system it flew
        return _render_flight(trained, out, frames=frames, fps=fps, speed=speed)
    if not isinstance(env, Renderable):
        raise RunError(f"render: env '{env.name}' does not play the role Renderable (no Newton model to draw)")
    params = step.params
    dt = float(env.dt)
    if frames is None:
        frames = real_time_frames(env.horizon, dt, fps, speed or 1.0, cap=None if speed else MAX_FRAMES)
    steps = sample_steps(env.horizon, frames)

    def snapshot() -> tuple[Any, dict[str, np.ndarray]]:
        shot, trajectory = sample_frames(env, step.task, params, steps)
        return shot, per_step_series(env.horizon, trajectory, params.numpy())

    before, before_values = snapshot()  # the parameters training started from
    trained.load()
    with step.at_eval_params():
        after, after_values = snapshot()

    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputError(f"render: cannot make the folder '{out}' ({exc.strerror or exc})") from None
    done = trained.checkpoint.iteration
    titles = ["before training (0 iterations)", f"after training ({done} iteration{'s' if done != 1 else ''})"]
    scene = Scene(env.model)
    targets = getattr(env, "targets", None)
    if isinstance(targets, wp.array) and targets.dtype == wp.vec3:
        scene.targets = targets.numpy().reshape(-1, 3)
    # Each file under a temporary name, renamed when complete (harness.runs.atomic_output).
    video, plot, panels, recordings = out / OUTPUTS[0], out / OUTPUTS[1], [], []
    try:
        count, layout = draw_video(scene, [before, after], titles, dt, video, fps=fps)
        if after_values:  # envs whose losses read only the last step have nothing to plot against time
            panels = draw_plots(before_values, after_values, dt, plot, env.component_names(), labels=titles)
        for name, shot in zip(OUTPUTS[2:], (before, after), strict=True):
            write_recording(env.model, shot, dt, out / name)
            recordings.append(str(out / name))
    except OutputError as exc:
        raise OutputError(f"render: {exc}") from None
    return {
        "checkpoint": str(trained.checkpoint.path),
        "video": str(video),
        "frames": count,
        "fps": fps,
        "speed": playback_speed(steps, dt, fps),
        "seconds": steps[-1] * dt,
        "layout": layout,
        "plot": str(plot) if panels else None,
        "panels": panels,
        "recordings": recordings,
    }


def _render_flight(trained: Any, out: Path, *, frames: int | None, fps: int, speed: float | None) -> dict[str, Any]:
    """A controller's run (``task=mpc``): run it again from its start (:meth:`harness.tasks.MPC.replay`)
    and draw the real system over its frames, its targets as crosses: ``rollout.mp4`` and the
    Newton recording ``flight.json``."""
    import warp as wp

    from harness.runs import OutputError
    from harness.video import (
        MAX_FRAMES,
        RUN_COLOURS,
        Frames,
        Scene,
        draw_video,
        playback_speed,
        real_time_frames,
        sample_steps,
        write_recording,
    )

    env = trained.run.env
    if out.is_dir():  # refused before the replay, not after (the video was checked by the caller)
        from harness.runs import check_writable

        try:
            check_writable(out / FLIGHT)
        except OutputError as exc:
            raise OutputError(f"render: {exc}") from None
    _, figures, poses = trained.run.task.replay(trained.trainer)
    count = poses.shape[0] - 1
    dt = float(env.dt)
    if frames is None:
        frames = real_time_frames(count, dt, fps, speed or 1.0, cap=None if speed else MAX_FRAMES)
    steps = sample_steps(count, frames)
    shot = Frames(steps=steps, body_q=poses[steps], particle_q=None)
    scene = Scene(env.plant_model)
    targets = getattr(env, "targets", None)
    if isinstance(targets, wp.array) and targets.dtype == wp.vec3:
        scene.targets = targets.numpy().reshape(-1, 3)
    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputError(f"render: cannot make the folder '{out}' ({exc.strerror or exc})") from None
    title = f"flight, {count} frames: mean distance {figures.get('mean_distance_m', float('nan')):.3f} m"
    video = out / OUTPUTS[0]
    try:
        drawn, layout = draw_video(scene, [shot], [title], dt, video, fps=fps, colours=(RUN_COLOURS[1],))
        write_recording(env.plant_model, shot, dt, out / FLIGHT)
    except OutputError as exc:
        raise OutputError(f"render: {exc}") from None
    return {
        "checkpoint": str(trained.checkpoint.path),
        "video": str(video),
        "frames": drawn,
        "fps": fps,
        "speed": playback_speed(steps, dt, fps),
        "seconds": steps[-1] * dt,
        "layout": layout,
        "plot": None,
        "panels": [],
        "recordings": [str(out / FLIGHT)],
        "flight": figures,
    }


FLIGHT = "flight.json"
"""A controller's recording (``task=mpc``): the real system over the replayed frames."""


def main(args: list[str]) -> None:
    """``render RUN_DIR [checkpoint=PATH] [fps=N] [speed=X | frames=N]``: video, plots and Newton recordings."""
    from harness.runs import RunError

    accepted = "checkpoint=PATH, fps=N, speed=X, frames=N"
    try:
        run_dir, options, unknown = run_folder_argument(args, "render", ("checkpoint", "frames", "fps", "speed"))
    except ValueError as exc:
        fail(exc)
    if unknown:
        fail(f"render: unknown option '{unknown[0].partition('=')[0]}'; accepted: {accepted}")
    if "frames" in options and "speed" in options:
        fail("render: give speed=X (the playback speed) or frames=N (that many states, at whatever speed), not both")
    numbers: dict[str, Any] = {}
    for key, least in (("frames", 2), ("fps", 1)):
        if key not in options:
            continue
        try:
            numbers[key] = int(options[key])
        except ValueError:
            numbers[key] = least - 1
        if numbers[key] < least:
            fail(f"render: {key} must be a whole number >= {least}, got {options[key]}")
    if "speed" in options:
        try:
            numbers["speed"] = float(options["speed"])
        except ValueError:
            numbers["speed"] = 0.0
        if not 0 < numbers["speed"] < float("inf"):
            fail(f"render: speed must be a number > 0 (1: real time, 0.25: slow motion), got {options['speed']}")
    try:
        written = render_run(run_dir, checkpoint=options.get("checkpoint"), **numbers)
    except RunError as exc:  # harness.runs.OutputError too: a destination that cannot be written
        fail(exc)
    from harness.video import MAX_FRAMES, RUN_COLOURS, speed_text

    where = "left of" if written["layout"] == "side by side" else "above"
    print(
        f"video: {written['video']}: {written['seconds']:.3g} s simulated, "
        f"{written['frames']} frames at {written['fps']} fps, {speed_text(written['speed'])}"
    )
    before, after = (c.removeprefix("tab:") for c in RUN_COLOURS)
    if "flight" in written:  # a controller's run: one panel, the flight replayed from its start
        flight = written["flight"]
        print(
            f"  the controller replayed from frame 0 ({after}): mean distance to the target "
            f"{flight.get('mean_distance_m', float('nan')):.3f} m"
        )
    else:
        print(f"  before training ({before}) {where} after training ({after}), from {written['checkpoint']}")
    if written["frames"] == MAX_FRAMES and written["speed"] > 1.005 and not {"frames", "speed"} & set(numbers):
        print(f"  (faster than real time: at most {MAX_FRAMES} frames by default; speed=1 draws all real time needs)")
    if written["plot"]:
        print(f"plot: {written['plot']} ({', '.join(written['panels'])})")
    print(f"Newton ViewerFile recordings: {', '.join(written['recordings'])}")
