"""Typed objects from a validated config: the one place a composed config becomes a run.

:func:`validate` builds every object that has no side effect (the task, the loss, each
parameter group's optimizer, clip policy and schedule) and checks them against each other
and against the env's config; :func:`build_env` builds the env (this compiles its kernels);
:func:`build_run` does both; :func:`precheck` checks a whole command line before Hydra
creates a folder. Everything below this module receives plain Python objects; the commands
(:mod:`harness.commands`) sit above it. Every error is a one-line
:class:`~harness.config.ConfigError` naming the field and what is accepted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from harness import init_warp, targets
from harness.config import (
    ConfigError,
    TrainSettings,
    auto_segment_steps,
    blame_typed,
    check_capture_setting,
    check_env_fields,
    check_saved_config,
    check_writable,
    compose_command,
    first_line,
    renamed_target,
    segment_steps,
)
from harness.config import validate as validate_values
from harness.derived import typed_keys

if TYPE_CHECKING:  # harness.checkpoint (numpy) is imported where a checkpoint is read
    from harness import checkpoint

__all__ = ["Run", "build_clip", "build_env", "build_run", "precheck", "validate"]


@dataclasses.dataclass
class Run:
    """Everything a training run needs, as typed objects.

    Attributes:
        rules: The update rule of every further parameter group of the task, by name (SHAC's
            ``critic``); the first group's is ``optimizer``, ``clip``, ``schedule``, ``nonfinite``.
    """

    env: Any
    loss: Any
    optimizer: Any
    clip: Any
    schedule: Any
    settings: TrainSettings
    task: Any = None
    segment_steps: int | None = None  # memory.segment_steps resolved for the env (the env is built with it)
    adjoint: Any = None  # clip.adjoint: harness.adjoint.AdjointSettings
    nonfinite: str = "skip"  # clip.nonfinite: the wrapper around the trainer's update
    rules: dict[str, Any] = dataclasses.field(default_factory=dict)
    diagnose: Any = None  # the diagnose section: harness.config.DiagnoseSettings
    device_note: str = ""  # why settings.device is the device: "device=cpu", or device=null's choice and reason

    def trainer(self, settings: TrainSettings | None = None) -> Any:
        """The :class:`~harness.training.Trainer` of this run (optionally with other loop settings)."""
        from harness.training import Trainer

        return Trainer(
            self.env,
            self.loss,
            self.optimizer,
            self.clip,
            settings or self.settings,
            schedule=self.schedule,
            task=self.task,
            adjoint=self.adjoint,
            nonfinite=self.nonfinite,
            rules=self.rules,
        )


def _instantiate(cfg: DictConfig | dict, group: str, **kwargs: Any) -> Any:
    """Build the object of section ``cfg[group]``, after :func:`harness.targets.check_section`
    has checked every ``_target_`` in it (the section with its interpolations resolved is
    checked, and that is what is built)."""
    section = cfg[group]
    target = section.get("_target_") if hasattr(section, "get") else None
    if renamed_target(target):
        raise ConfigError(f"{group}._target_: '{target}' was renamed; use {renamed_target(target)}")
    if isinstance(section, DictConfig):
        section = OmegaConf.to_container(section, resolve=True)
    try:
        targets.check_section(group, section)
    except targets.TargetError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return hydra.utils.instantiate(section, _convert_="all", **kwargs)
    except hydra.errors.InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, ValueError):
            raise ConfigError(str(cause).splitlines()[0]) from None
        raise ConfigError(f"{group}: could not be built ({str(cause or exc).splitlines()[0]})") from None


CLIP_SETTINGS = ("nonfinite", "adjoint")
"""Keys of the ``clip`` group that are not arguments of the policy's factory
(``configs/base/clip.yaml``): the non-finite wrapper and clipping inside backward."""


def build_clip(cfg: DictConfig | Mapping[str, Any]) -> tuple[Any, str, Any]:
    """The ``clip`` section as the policy, the non-finite mode and the adjoint settings.

    ``_target_`` and its arguments build the policy; ``clip.nonfinite`` picks the wrapper
    around the group's whole update (:class:`harness.training.groups.UpdateRule`),
    ``clip.adjoint`` the :class:`~harness.adjoint.AdjointSettings`.

    Raises:
        ConfigError: One line naming the field and what is accepted.
    """
    from harness.adjoint import AdjointSettings
    from harness.clip.nonfinite import check_mode

    section = cfg["clip"]
    section = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    settings = {key: section.pop(key) for key in CLIP_SETTINGS if key in section}
    policy = _instantiate({"clip": section}, "clip")
    try:
        return policy, check_mode(settings.get("nonfinite", "skip")), AdjointSettings.parse(settings.get("adjoint"))
    except ValueError as exc:
        raise ConfigError(first_line(exc)) from None


def build_rule(section: Mapping[str, Any], where: str) -> Any:
    """The :class:`~harness.training.groups.UpdateRule` a further parameter group's section
    describes: its ``optim``, ``clip`` and ``schedule`` (each a ``_target_`` node, as the
    top-level groups; ``clip`` and ``schedule`` optional).

    Raises:
        ConfigError: One line naming ``<where>.<field>``.
    """
    from harness.training.groups import UpdateRule

    if "optim" not in section:
        raise ConfigError(f"{where}.optim: required (the group's optimizer, e.g. _target_: harness.optim.adam)")
    try:
        optimizer = _instantiate(section, "optim")
        clip, nonfinite, adjoint = build_clip(section) if section.get("clip") is not None else (None, "skip", None)
        schedule = _instantiate(section, "schedule") if section.get("schedule") is not None else None
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    if adjoint is not None and adjoint.active:
        raise ConfigError(f"{where}.clip.adjoint: clipping inside backward is the first group's; accepted: null")
    return UpdateRule(optimizer, clip, schedule, nonfinite)


def validate(cfg: DictConfig, choices: Mapping[str, Any] | None = None) -> Run:
    """Check everything that can be checked without compiling a kernel or writing a file.
    A refused value derived from one the running job's overrides set is reported under the
    key that was typed (:func:`harness.config.blame_typed`).

    Returns:
        The run with every side-effect-free object built and ``env`` still None.
    """
    try:
        return _validate(cfg, choices)
    except ConfigError as exc:
        raise blame_typed(cfg, exc) from None


def _validate(cfg: DictConfig, choices: Mapping[str, Any] | None = None) -> Run:
    checked = validate_values(cfg)
    env_class, env_fields = checked.env_class, checked.env_config
    task = _instantiate(cfg, "task")
    try:
        missing = task.missing_role(env_class)
        if missing is not None:
            raise ValueError(missing)
        task.check_env(env_class.name, env_fields)
        task.check(env_fields)
        loss = task.replace_loss(_instantiate(cfg, "loss"))
        loss.check(env_fields.observable_dims())
        task.check_loss(loss)
    except ValueError as exc:
        raise ConfigError(first_line(exc)) from None
    steps = segment_steps(cfg, env_class, task.training_config(env_fields))
    try:
        task.check_segments(steps, env_fields)
    except ValueError as exc:
        raise ConfigError(first_line(exc)) from None
    settings, device_note = _resolve_device(checked.settings, task.training_config(env_fields).world_count)
    check_capture_setting(settings, env_class)
    clip, nonfinite, adjoint = build_clip(cfg)
    rules = {}
    for group, where in task.group_settings().items():
        section = OmegaConf.select(cfg, where)
        if section is None:
            raise ConfigError(f"{where}: required (the optimizer, clip and schedule of parameter group '{group}')")
        rules[group] = build_rule(section, where)
    return Run(
        env=None,
        loss=loss,
        optimizer=_instantiate(cfg, "optim"),
        clip=clip,
        adjoint=adjoint,
        nonfinite=nonfinite,
        schedule=_instantiate(cfg, "schedule") if cfg.get("schedule") is not None else None,
        settings=settings,
        task=task,
        segment_steps=steps,
        rules=rules,
        diagnose=checked.diagnose,
        device_note=device_note,
    )


def _resolve_device(settings: TrainSettings, world_count: int) -> tuple[TrainSettings, str]:
    """``settings`` with ``device=null`` replaced by the device chosen for ``world_count``
    worlds (:func:`harness.devices.resolve`), and the phrase saying why."""
    from harness import devices

    name, why = devices.resolve(settings.device, world_count)
    return dataclasses.replace(settings, device=name), why


_PREBUILT: dict[tuple[str, str | None, int | None], Any] = {}
"""The env the command line's early check built (:func:`precheck`), by (resolved env
config, device, ``memory.segment_steps``), handed once to the run's :func:`build_run`."""


def build_env(
    cfg: DictConfig, device: str | None, steps: int | None = None, task: Any = None, *, evaluation: bool = False
) -> Any:
    """Build the env of ``cfg`` (this compiles its kernels), in segments of ``steps`` steps
    when given (``Run.segment_steps``, from :func:`validate`), with the config ``task``
    trains on when given (:meth:`harness.tasks.Task.training_config`), or evaluates on
    with ``evaluation`` (:meth:`harness.tasks.Task.evaluation_config`).

    Raises:
        ConfigError: One line when the env's own code raises while building.
    """
    init_warp(check_environment=False)  # before the env's first array: no CUDA driver warning
    env_class, env_config = check_env_fields(cfg)
    if task is not None:
        env_config = task.evaluation_config(env_config) if evaluation else task.training_config(env_config)
    try:
        return env_class(env_config, device=device, **({"segment_steps": steps} if steps is not None else {}))
    except Exception as exc:
        raise ConfigError(
            f"env: building {env_class.__module__}.{env_class.__qualname__} failed: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from None


def _env_key(cfg: DictConfig, run: Run) -> tuple[str, str | None, int | None]:
    return OmegaConf.to_yaml(cfg.env, resolve=True), run.settings.device, run.segment_steps


def build_run(cfg: DictConfig, choices: Mapping[str, Any] | None = None, *, evaluation: bool = False) -> Run:
    """Validate the whole config, then build the env (this compiles its kernels), or take
    the one :func:`precheck` built for this very env config and device. ``evaluation``
    builds the env a run is evaluated on (a windowed policy's whole episode)."""
    run = validate(cfg, choices)
    if evaluation:
        run.env = build_env(cfg, run.settings.device, None, run.task, evaluation=True)
        return run
    run.env = _PREBUILT.pop(_env_key(cfg, run), None) or build_env(
        cfg, run.settings.device, run.segment_steps, run.task
    )
    return run


PRECHECKED: dict[str, Any] = {}
"""The composed command line's ``resume`` and ``overwrite`` (set by :func:`precheck`), which
decide whether a run may write into a folder that holds a run."""


def precheck(config_name: str, args: list[str]) -> Path | None:
    """Validate a command line before Hydra creates any folder.

    Checks the override syntax, every config-group choice, composes the config (with
    only the values shared by all jobs in a multirun), validates it, checks that the
    output folder can be written and that a checkpoint to resume from fits this run, all
    before any kernel compiles. Then, for a single run, builds the env (kept for the run:
    :func:`build_env`), so a user's env that raises while building writes nothing either.
    Raises :class:`ConfigError` with one line.

    Returns:
        The run folder a ``resume=<path>`` continues in, else None.
    """
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if not a.startswith("-")]
    cfg, choices, parsed = compose_command(config_name, overrides, multirun=multirun)
    try:
        return _precheck(config_name, cfg, choices, parsed, multirun)
    except ConfigError as exc:  # a refused derived value is reported under the key typed
        raise blame_typed(cfg, exc, [o.key_or_group for o in parsed]) from None


def _precheck(
    config_name: str, cfg: DictConfig, choices: Mapping[str, Any], parsed: list[Any], multirun: bool
) -> Path | None:
    PRECHECKED.clear()
    PRECHECKED.update(resume=cfg.get("resume"), overwrite=bool(cfg.get("overwrite", False)))
    run = validate(cfg, choices)
    if config_name == "gradcheck":
        groups = run.task.group_shapes(check_env_fields(cfg)[1])
        if len(groups) > 1:
            raise ConfigError(
                f"task: gradcheck checks a task that trains one parameter group; '{run.task.name}' trains "
                f"{len(groups)} ({', '.join(groups)}); accepted: a one-group task (task=policy checks a "
                "policy's gradient through the same env)"
            )
    given = {o.key_or_group: o.value() for o in parsed if not o.is_sweep_override()}
    field = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    default_root = "multirun" if multirun else "outputs"
    check_writable(field, Path(str(given.get(field, default_root))))
    resume = cfg.get("resume")
    if multirun:
        if resume not in (None, "auto"):
            raise ConfigError(
                "resume: a checkpoint path cannot be shared by the jobs of a multirun; accepted: null, auto"
            )
        if choices.get("hydra/launcher") == "ray" and importlib.util.find_spec("ray") is None:
            raise ConfigError(
                "hydra/launcher=ray: Ray is not installed; accepted: pip install -e '.[ray]', or another "
                "launcher (joblib, submitit_local, submitit_slurm)"
            )
        return None
    folder = None if resume is None else check_resume(str(resume), given.get("hydra.run.dir"), cfg, run)
    from harness import limits  # the run's memory against what is free, before anything is allocated

    if config_name == "diagnose":  # its own envs: the samples' worlds at the longest horizon, built later
        probe_cfg, probe_run = diagnose_memory_config(cfg, choices, run)
        where = "in segments" if probe_run.segment_steps is not None else "on one tape"
        size = f"diagnose: {probe_cfg.env.world_count} starts x {probe_cfg.env.horizon} steps {where}"

        def refused(message: str) -> ConfigError:
            needs = message.partition(": ")[2].rsplit("; accepted:", 1)[0]
            return ConfigError(f"{size}: {needs}; accepted: a smaller diagnose.samples or shorter diagnose.horizons")

        limits.check_memory(probe_cfg, probe_run, error=refused)
        return folder
    limits.check_memory(cfg, run)
    _PREBUILT.clear()
    # a failure while building writes nothing
    _PREBUILT[_env_key(cfg, run)] = build_env(cfg, run.settings.device, run.segment_steps, run.task)
    return folder


def diagnose_sized(task: Any, env_config: Any, worlds: int) -> Any:
    """The env config ``harness diagnose`` measures with ``worlds`` starts (one per world),
    as the task sizes it (``task=sysid``: the recording's worlds and steps)."""
    return task.training_config(dataclasses.replace(env_config, world_count=worlds))


def measurement_maker(cfg: DictConfig, choices: Mapping[str, Any] | None = None) -> Any:
    """``make(worlds)`` for the gradient measurements a training run takes of itself
    (``diagnose.every``, ``task.window=auto``): ``(make_env, task, loss)`` built afresh from the
    run's config as it is evaluated (:func:`evaluation_config`), with ``worlds`` starts
    (:func:`diagnose_sized`, :func:`diagnose_envs`)."""
    import copy

    probe_cfg = copy.deepcopy(cfg)
    evaluation_config(probe_cfg, task_class(probe_cfg))

    def make(worlds: int) -> tuple[Any, Any, Any]:
        run = validate(probe_cfg, choices)
        env_class, env_config = check_env_fields(probe_cfg)
        sized = diagnose_sized(run.task, env_config, worlds)
        return diagnose_envs(env_class, sized, run.settings.device), run.task, run.loss

    return make


def diagnose_envs(env_class: type, sized: Any, device: str | None) -> Any:
    """``make_env(steps, segmented)``: the env of one horizon of a diagnosis, ``sized``
    (:func:`diagnose_sized`) at ``steps``, in segments of about ``sqrt(steps)`` when
    ``segmented`` and the env can run in segments (:func:`harness.diagnose.diagnose`)."""

    def make_env(steps: int, segmented: bool) -> Any:
        env_cfg = dataclasses.replace(sized, horizon=steps)
        segments = {}
        if segmented and env_class.segment_blocker(env_cfg) is None:
            segments = {"segment_steps": auto_segment_steps(steps)}
        return env_class(env_cfg, device=device, **segments)

    return make_env


def diagnose_memory_config(cfg: DictConfig, choices: Mapping[str, Any], run: Run) -> tuple[DictConfig, Run]:
    """The config and run whose memory ``harness diagnose`` needs at its longest horizon: one
    world per start (``diagnose.samples``, or what the task fixes), whole rollouts, in segments
    where the longest horizon reaches ``diagnose.segment_from`` and its segments can share their
    captured graphs (:mod:`harness.diagnose`), else on one tape."""
    import copy

    from harness.memory import shares_segment_graphs

    settings = run.diagnose
    probe = copy.deepcopy(cfg)
    evaluation_config(probe, task_class(probe))
    env_class, env_config = check_env_fields(probe)
    sized = diagnose_sized(run.task, env_config, settings.samples)
    longest = max(settings.horizons or [sized.horizon])
    segmented = (
        settings.segment_from is not None
        and longest >= settings.segment_from
        and run.settings.capture is not False
        and env_class.segment_blocker(sized) is None
        and shares_segment_graphs(env_class, run.task)
    )
    with open_dict(probe):
        probe.env.world_count = sized.world_count
        probe.env.horizon = longest
        probe.memory.segment_steps = "auto" if segmented else None
    return probe, validate(probe, choices)


def check_resume(resume: str, run_dir: Any, cfg: DictConfig, run: Run) -> Path | None:
    """Verify the checkpoint a resume would read before anything runs.

    Checks the file (checksum), that it belongs to this problem (env, parameter shapes,
    every config value except :data:`harness.config.RESUME_MAY_CHANGE`) and that
    ``iterations`` reaches it. Returns the run folder a ``resume=<path>`` continues in (None
    for ``auto``).
    """
    if resume == "auto" and run_dir is None:
        return None  # a fresh Hydra folder has no checkpoint: auto starts from scratch
    from harness import checkpoint

    try:
        path = checkpoint.resolve(resume, Path(str(run_dir)) if run_dir is not None else Path("."))
        if path is None:
            return None
        saved = checkpoint.load(path)
    except checkpoint.CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    path = path.absolute()
    run_folder = None
    if resume != "auto":
        if path.parent.name != "checkpoints":
            raise ConfigError(
                f"resume: '{path}' is not inside a run's checkpoints/ folder; "
                "accepted: auto, a run folder or <run>/checkpoints/ckpt_*.hckpt"
            )
        run_folder = path.parent.parent
        if run_dir is not None and Path(str(run_dir)).resolve() != run_folder.resolve():
            raise ConfigError(
                f"resume: '{path}' belongs to run folder '{run_folder}'; drop hydra.run.dir or set it to that folder"
            )
    env_class, env_config = check_env_fields(cfg)
    try:
        checkpoint.check_fits(
            saved, path, env=env_class.name, shapes=run.task.flat_shapes(env_config), iterations=cfg.iterations
        )
    except checkpoint.CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    check_saved_config(saved, cfg, path)
    return run_folder


def task_class(cfg: DictConfig) -> Any:
    """The task class ``task._target_`` names, checked to be a :class:`harness.tasks.Task`
    subclass without calling anything (None when the section has no ``_target_``).

    Raises:
        ConfigError: One line naming ``task._target_`` and what is accepted.
    """
    if "_target_" not in cfg.task:
        return None
    try:
        return targets.resolve("task", cfg.task._target_, "task._target_")
    except targets.TargetError as exc:
        raise ConfigError(str(exc)) from None


def evaluation_config(cfg: DictConfig, task_class: Any = None) -> None:
    """Turn a run's composed config into the one it is evaluated with, in place: no segments,
    and every task setting that only shapes training (:attr:`harness.tasks.Task.training_only`,
    such as a policy's ``window``) unset: a run is evaluated over whole episodes."""
    with open_dict(cfg):
        cfg.memory.segment_steps = None
        for key in getattr(task_class, "training_only", ()):
            if key in cfg.task:
                cfg.task[key] = None


def episode_evaluator(cfg: DictConfig, choices: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """For a policy task (one with settings that only shape training, :attr:`harness.tasks.Task.training_only`:
    ``task=policy``, ``task=shac``), what rolls out whole episodes from the env's own starts
    while it trains (:class:`harness.training.Episodes`): the run's config as ``harness evaluate``
    builds it (:func:`evaluation_config`), its own env, task, loss and state. Other tasks: None.

    Returns:
        The evaluator (or None), and why a policy run gets none: its episodes would not fit in
        the memory left (checked as ``harness evaluate`` checks it), or they cannot be built.
    """
    import copy

    from harness import limits
    from harness.training import Episodes

    klass = task_class(cfg)
    if not getattr(klass, "training_only", ()):
        return None, None
    probe = copy.deepcopy(cfg)
    evaluation_config(probe, klass)
    untaped_config(probe)
    try:
        run = validate(probe, choices)
        env_config = run.task.evaluation_config(check_env_fields(probe)[1])
        limits.check_memory(probe, run, env_config=env_config, training=False)
        run = build_run(probe, choices, evaluation=True)
        trainer = run.trainer()
    except (ConfigError, ValueError) as exc:
        return None, first_line(exc)
    return Episodes(run.env, run.task, run.loss, trainer.step.state), None


def untaped_config(cfg: DictConfig) -> None:
    """Make a config's env one that records no tape, in place: a Newton env (``per_step_states``)
    steps two States in turn instead of keeping one per step, so a robot's 1000-step episode fits
    where its taped window would not. For what only rolls out (``evaluate``, ``render``, the
    episodes a policy run reports), never for what differentiates (``diagnose``: its gradients
    would be wrong)."""
    from omegaconf import open_dict

    if "per_step_states" in cfg.env:
        with open_dict(cfg):
            cfg.env.per_step_states = False


@dataclasses.dataclass
class TrainedRun:
    """A run rebuilt from its folder with a checkpoint loaded (:func:`trained_run`).

    Attributes:
        run: The run's objects (its env built for evaluation: whole episodes).
        trainer: Its trainer, every parameter group holding the checkpoint's values.
        checkpoint: The checkpoint loaded.
        choices: The run's config-group choices (``task``, ``env``, ...).
    """

    run: Run
    trainer: Any
    checkpoint: checkpoint.Checkpoint
    choices: dict[str, Any]

    def load(self) -> None:
        """Load the checkpoint into every parameter group (and what the task carries that an
        evaluation uses).

        Raises:
            harness.runs.RunError: One line: the checkpoint's arrays do not fit.
        """
        from harness.runs import RunError

        state = self.trainer.step.state
        try:
            # a windowed policy's checkpoint also holds the state its training carried between
            # windows; an evaluation rolls whole episodes from the env's own starts and needs only
            # what the task names (harness.tasks.Task.evaluation_state)
            state.load(self.checkpoint.arrays, task_keys=getattr(self.run.task, "evaluation_state", ()))
        except ValueError as exc:
            raise RunError(f"checkpoint: '{self.checkpoint.path}' does not fit this run ({exc})") from None


def trained_run(
    folder: Any,
    overrides: list[str] = (),
    *,
    checkpoint_name: str | None = None,
    device: str | None = None,
    load: bool = True,
) -> TrainedRun:
    """Rebuild a run folder's run with other ``env.<field>=value`` overrides and load its newest
    (or ``checkpoint_name``) checkpoint: what ``evaluate``, ``render`` and ``diagnose`` start from.

    The env is built for evaluation (whole episodes from the env's own starts, no segments);
    overrides that change a parameter's shape are refused, and the checkpoint's identity
    (env, layout, optimizer, schedule, clip policy) is checked as a resume checks it.

    Args:
        folder: The :class:`harness.runs.RunFolder`.
        overrides: Further overrides (after the run's own).
        checkpoint_name: A checkpoint file, or None for the newest.
        device: The Warp device to rebuild on (None: the run's own setting).
        load: Load the checkpoint (else the parameters stay where training started;
            :meth:`TrainedRun.load` loads it later).

    Raises:
        harness.runs.RunError: One line naming what does not fit.
    """
    from harness import checkpoint
    from harness.runs import RunError

    command = folder.command
    saved = folder.checkpoint(checkpoint_name)
    path = saved.path
    extra = [f"device={device}"] if device else []
    try:
        cfg, choices, _ = compose_command("train", [*folder.overrides, *overrides, *extra])
    except (ConfigError, ImportError) as exc:
        raise RunError(f"{command}: {first_line(exc)}") from None
    try:
        evaluation_config(cfg, task_class(cfg))
        untaped_config(cfg)
        run = build_run(cfg, choices, evaluation=True)
    except (ConfigError, ImportError) as exc:  # a refused derived value named by the key typed
        raise RunError(f"{command}: {blame_typed(cfg, exc, typed_keys(overrides))}") from None
    mine = run.task.flat_shapes(run.env.config)
    theirs, _ = checkpoint.flat_identity(saved.meta)
    if saved.meta.get("env") == run.env.name and mine != theirs:
        changed = next(name for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name))
        raise RunError(
            f"{command}: {' '.join(overrides) or 'the config'} changes parameter '{changed}' from shape "
            f"{theirs.get(changed)} to {mine.get(changed)}; accepted: overrides that keep the trained shapes"
        )
    try:
        trainer = run.trainer()
        checkpoint.check_identity(saved, path, trainer.step.identity(), field="checkpoint")
    except (ValueError, checkpoint.CheckpointError) as exc:
        raise RunError(first_line(exc)) from None
    trained = TrainedRun(run, trainer, saved, dict(choices))
    if load:
        trained.load()
    return trained


def check_evaluation_memory(folder: Any, overrides: list[str], *, device: str | None = None) -> None:
    """:func:`harness.limits.check_memory` for the env ``evaluate`` or ``render`` builds from a run folder with
    ``overrides`` (composed as :func:`harness.build.trained_run` composes it: whole episodes, no
    segments). A config that does not compose is left to ``trained_run`` to report.

    Raises:
        harness.runs.RunError: One line: the rollout will not fit.
    """
    from harness.config import ConfigError, check_env_fields, compose_command
    from harness.limits import check_memory
    from harness.runs import RunError

    extra = [f"device={device}"] if device else []
    try:
        cfg, choices, _ = compose_command("train", [*folder.overrides, *overrides, *extra])
        evaluation_config(cfg, task_class(cfg))
        untaped_config(cfg)
        run = validate(cfg, choices)
        env_config = run.task.evaluation_config(check_env_fields(cfg)[1])
    except (ConfigError, ImportError, ValueError):
        return
    check_memory(
        cfg, run, env_config=env_config, training=False, error=lambda line: RunError(f"{folder.command}: {line}")
    )


def tiny_iteration(cfg: Any, choices: Any) -> None:
    """Build the run of ``cfg`` at its shortest (one step, the task's evaluation settings: no
    windows; its own world count, which a task may tie other settings to) and run one
    iteration, its log-step work and its evaluation: every kernel an iteration of the full run
    launches (a captured iteration records the same ones).
    ``cfg`` is changed in place.

    Raises:
        harness.config.ConfigError: The config does not build (one line).
    """
    evaluation_config(cfg, task_class(cfg))  # one step: no windows
    with open_dict(cfg):
        cfg.env.horizon = 1
    run = build_run(cfg, choices)
    settings = TrainSettings(iterations=1, log_every=1, seed=run.settings.seed, device=run.settings.device)
    trainer = run.trainer(settings)
    trainer.step.run()
    trainer.step.log_values()
    trainer.step.evaluate()
