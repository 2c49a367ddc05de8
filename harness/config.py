"""Compose a Hydra config and validate it, without building anything.

This module owns composition (the package's config groups, folders on
:data:`CONFIG_PATH_VARIABLE`, a task's per-env settings, the resolvers), the checks of a
command line before Hydra creates a folder (the override syntax, every group choice, keys
that do not exist), and the validation of the values whose schemas are known without
building an object: the loop settings (:class:`TrainSettings`, the top level of
``train.yaml``), the env's fields (its ``Config`` schema), ``memory.segment_steps``, the
device. Building typed objects from a validated config (the env, task, loss, optimizer,
clip policy, schedule) is :mod:`harness.build`; the commands are :mod:`harness.commands`.
Hydra lives only here, in :mod:`harness.build`, :mod:`harness.sweep` and the commands.
Every error is a :class:`ConfigError` whose message is one line naming the field and what
is accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.schema import field

_PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
_CHECKOUT_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if (_PACKAGED_CONFIGS / "train.yaml").is_file() else _CHECKOUT_CONFIGS
"""The config groups: the checkout's top-level ``configs/``; an installed wheel carries the
same files as ``harness/configs/`` (``setup.py``), which is found first."""

CONFIG_PATH_VARIABLE = "HARNESS_CONFIG_PATH"
"""Environment variable naming further config folders (``os.pathsep``-separated), searched
after the package's own: a user's ``env/my_robot.yaml`` there is ``+env=my_robot``."""

GROUPS = ("env", "task", "loss", "optim", "clip", "schedule")
"""Config groups that select a typed object."""

BASE_GROUP = "base"
"""Config files shared by every option of a group (``base/clip.yaml``, ``base/schedule.yaml``),
placed by the options' defaults lists; not a choice of the command line."""


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and what is accepted."""


CAPTURE_MODES = ("auto", True, False)
"""Accepted values of the ``capture`` setting."""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Loop settings: the schema of the top level of ``configs/train.yaml``, built from the
    composed config by :func:`harness.schema.build` (types and ranges from these fields;
    ``checkpoint_every`` reads ``checkpoint.every``).

    Attributes:
        iterations: Optimisation steps.
        log_every: Read back, write TensorBoard and print progress every N iterations.
        seed: Run seed (the env's initial conditions are drawn from it).
        device: Warp device name (``cuda`` is read as ``cuda:0``); None: the faster device for
            the run (:func:`harness.devices.choose`), resolved by :func:`harness.build.validate`.
        checkpoint_every: Write a checkpoint every N iterations (0: only at the end and on
            SIGINT/SIGTERM).
        checkpoint_keep: How many of the newest checkpoints to keep.
        resume: None (start fresh), ``auto`` (the newest checkpoint in the run folder, if
            any), or the path of a checkpoint file or run folder.
        overwrite: A ``hydra.run.dir`` (a sweep: ``hydra.sweep.dir``) that holds a run is
            emptied and trained into; False: such a folder is refused unless a resume
            continues it (:func:`harness.runs.claim_run_folder`).
        capture: ``auto`` (capture one iteration into a graph when the device and every
            component allow it, else run eagerly and say why), True (capture or refuse),
            False (every iteration eagerly).
        plot_every: A TensorBoard image of the rollout against time (``loss/rollout``) at
            the first log step, at the first log step after every multiple of this many
            iterations and at the end; 0: the first log step and the end only; None: never.
    """

    iterations: int = field(100, minimum=1)
    log_every: int = field(10, minimum=1)
    seed: int = field(0, minimum=0)
    device: str | None = field(None)
    checkpoint_every: int = field(0, minimum=0, key="checkpoint.every")
    checkpoint_keep: int = field(3, minimum=1, key="checkpoint.keep")
    resume: str | None = field(None)
    overwrite: bool = field(False)
    capture: bool | str = field("auto", choices=CAPTURE_MODES)
    plot_every: int | None = field(50, minimum=0)

    def check(self) -> None:
        if self.resume == "":
            raise ValueError("resume: expected null, auto, or a checkpoint file or run folder path, got ''")


@dataclasses.dataclass(frozen=True)
class DiagnoseSettings:
    """The ``diagnose`` section (``configs/train.yaml``): what ``python -m harness diagnose``
    measures (:mod:`harness.diagnose`, docs/diagnose.md) and how often training measures it.

    Attributes:
        every: During training, measure snr and zo_cosine at the current parameters every N
            iterations and log them to TensorBoard (``diagnose/*``); 0: never.
        horizons: Steps of every horizon measured; None: the env's horizon, halved down to
            ``shortest`` (a geometric set).
        shortest: The shortest horizon of the default set.
        samples: Starts per horizon, simulated as the worlds of one rollout (a task whose
            parameters have a world axis during training uses training's worlds instead).
        segment_from: Horizons of at least this many steps run in captured segments of about
            ``sqrt(steps)`` steps (bounded memory, :class:`harness.memory.SegmentGraphs`) where
            the env and task allow it, else on one tape; None: always one tape.
        zo_pairs: Antithetic Gaussian perturbations of the zeroth-order estimate.
        zo_scale: Their standard deviation, in multiples of each parameter's finite-difference step.
        fd_directions: Random directions of the central-difference check.
        fd_scale: Its step along a direction, in multiples of the finite-difference steps.
        snr_min: A horizon is trusted when the snr of a training batch's mean gradient
            (``snr_batch``) is at least this (a shared parameter only: where every world
            trains its own, a batch averages nothing) ...
        zo_cosine_min: ... and its zo_cosine at least this.
        seed: Seeds the perturbations, the directions and a policy's drawn starts.
    """

    every: int = field(0, minimum=0)
    horizons: tuple[int, ...] | None = field(None, minimum=1)
    shortest: int = field(8, minimum=1)
    samples: int = field(16, minimum=2)
    segment_from: int | None = field(1000, minimum=1)
    zo_pairs: int = field(16, minimum=2)
    zo_scale: float = field(1.0, minimum=0.0, strict=True)
    fd_directions: int = field(4, minimum=0)
    fd_scale: float = field(1.0, minimum=0.0, strict=True)
    snr_min: float = field(1.0, minimum=0.0)
    zo_cosine_min: float = field(0.5, minimum=-1.0, maximum=1.0)
    seed: int = field(0, minimum=0)


def diagnose_settings(cfg: DictConfig) -> DiagnoseSettings:
    """The ``diagnose`` section of ``cfg``, checked (defaults when it has none).

    Raises:
        ConfigError: One line naming ``diagnose.<field>`` and what is accepted.
    """
    from harness.schema import SchemaError, build

    section = cfg.get("diagnose")
    values = OmegaConf.to_container(section, resolve=True) if section is not None else {}
    try:
        return build(DiagnoseSettings, values or {}, prefix="diagnose")
    except SchemaError as exc:
        raise ConfigError(str(exc)) from None


AUTO = "auto"
"""``memory.segment_steps=auto``: :func:`auto_segment_steps` of the horizon."""


def auto_segment_steps(horizon: int) -> int:
    """About ``sqrt(horizon)`` steps per segment (at least 1): as many segments as steps in
    one, which makes the saved states and one segment's tape about the same size."""
    return max(1, round(math.sqrt(horizon)))


def resolve_segment_steps(value: Any, horizon: int) -> int | None:
    """``memory.segment_steps`` as steps per segment: None, ``auto`` or an integer in
    ``[1, horizon]``.

    Raises:
        ValueError: One line naming ``memory.segment_steps`` and what is accepted.
    """
    if value is None:
        return None
    if value == AUTO:
        return auto_segment_steps(horizon)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"memory.segment_steps: expected null, auto or an integer, got {value!r}")
    if not 1 <= value <= horizon:
        raise ValueError(
            f"memory.segment_steps: {value} is outside [1, env.horizon={horizon}]; accepted: null, auto, 1 .. {horizon}"
        )
    return value


def search_path_overrides(overrides: list[str]) -> list[str]:
    """``overrides`` plus the folders of :data:`CONFIG_PATH_VARIABLE` as ``hydra.searchpath``
    (unless the command line sets ``hydra.searchpath`` itself)."""
    folders = [f for f in os.environ.get(CONFIG_PATH_VARIABLE, "").split(os.pathsep) if f]
    if not folders or any(o.lstrip("+~").startswith("hydra.searchpath=") for o in overrides):
        return list(overrides)
    for folder in folders:
        if not Path(folder).is_dir():
            raise ConfigError(f"{CONFIG_PATH_VARIABLE}: '{folder}' is not a folder")
    paths = ",".join(f"'file://{Path(f).resolve()}'" for f in folders)
    return [*overrides, f"hydra.searchpath=[{paths}]"]


def available(group: str, overrides: list[str] | None = None) -> list[str]:
    """Option names of a config group, from Hydra's config repository: the package's own
    and those in folders on the search path (``hydra.searchpath`` among ``overrides``, or
    :data:`CONFIG_PATH_VARIABLE`)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    search = [o for o in search_path_overrides(list(overrides or [])) if o.startswith("hydra.searchpath=")]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        return sorted(set(loader.get_group_options(group, config_name="train", overrides=search)))


def groups() -> list[str]:
    """The config groups a command line may choose from (``hydra`` and :data:`BASE_GROUP` excluded)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        found = GlobalHydra.instance().config_loader().list_groups("")
        return sorted(g for g in found if g not in ("hydra", BASE_GROUP))


def require_env(cfg: DictConfig) -> None:
    """Stop with the list of envs when the command line did not pick one."""
    if cfg.get("env") is None:
        raise ConfigError(
            f"env: no environment selected; pick one with +env=NAME, available: {', '.join(available('env'))}"
        )


def check_device(name: str | None) -> str | None:
    """Accept None (the faster device for the run: :func:`harness.devices.choose`) or a device
    name Warp takes (``cpu``, ``cuda``, ``cuda:N``); returns the device's alias (``cuda`` ->
    ``cuda:0``) or None."""
    from harness import devices

    try:
        return devices.check(name)
    except devices.DeviceError as exc:
        raise ConfigError(str(exc)) from None


def check_env_fields(cfg: DictConfig) -> tuple[Any, Any]:
    """Check the env section against its class's schema without building the simulation.

    Returns:
        The env class and its checked config (an instance of the class's ``Config``).
    """
    from harness import targets
    from harness.schema import SchemaError, build

    if not isinstance(cfg.get("env"), DictConfig):
        raise ConfigError("env: expected a mapping of the env's fields (a YAML file with _target_: ...)")
    fields = OmegaConf.to_container(cfg.env, resolve=True)
    target = fields.pop("_target_", None)
    try:  # the class is imported and checked, never called here (the env is built from the schema)
        env_class = targets.resolve("env", target, "env._target_")
    except targets.TargetError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return env_class, build(env_class.Config, fields, prefix="env")
    except SchemaError as exc:
        raise ConfigError(str(exc)) from None


def own_error(cfg: DictConfig, key: str, value: Any) -> str | None:
    """The one-line refusal of ``value`` at ``key`` by that key's own schema (an env field, or a
    loop setting at the top level), or None where it passes or no schema is known."""
    from harness import targets
    from harness.schema import SchemaError, check_field

    schema, name = TrainSettings, key
    if key.startswith("env."):
        try:
            schema = targets.resolve("env", cfg.env.get("_target_"), "env._target_").Config
        except Exception:  # the env's own check reports a bad _target_
            return None
        name = key.removeprefix("env.")
    try:
        check_field(schema, name, value, key)
    except SchemaError as exc:
        return str(exc)
    except KeyError:
        return None
    return None


def blame_typed(cfg: DictConfig, exc: Exception, typed: list[str] | None = None) -> ConfigError:
    """``exc`` as a :class:`ConfigError` that names the key the command line typed, where the
    refused key is an interpolation of it (:func:`harness.derived.blame`). ``typed``: the keys
    the command line set; None reads them from Hydra's overrides of the running job (none
    outside a job)."""
    from harness import derived

    if typed is None:
        from hydra.core.hydra_config import HydraConfig

        typed = derived.typed_keys(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return ConfigError(derived.blame(cfg, first_line(exc), typed, lambda k, v: own_error(cfg, k, v)))


TOP_LEVEL_SECTIONS = (*GROUPS, "memory", "gradcheck", "diagnose")
"""Top-level keys of a composed config that are not loop settings (the groups have their
own schemas; ``memory.segment_steps`` is checked against the env's horizon)."""


def train_settings(cfg: DictConfig) -> Any:
    """The loop settings of ``cfg``'s top level (:class:`TrainSettings`,
    its schema), with the device checked against the devices Warp sees.

    Raises:
        ConfigError: One line naming the field and what is accepted.
    """
    from harness.schema import SchemaError, build

    values = OmegaConf.to_container(cfg, resolve=True)
    try:
        settings = build(TrainSettings, values, prefix="", ignore=TOP_LEVEL_SECTIONS)
    except SchemaError as exc:
        raise ConfigError(str(exc)) from None
    return dataclasses.replace(settings, device=check_device(settings.device))


@dataclasses.dataclass(frozen=True)
class Checked:
    """What :func:`validate` checked: the loop settings, and the env class with its checked config."""

    settings: TrainSettings
    env_class: Any
    env_config: Any
    diagnose: DiagnoseSettings = dataclasses.field(default_factory=DiagnoseSettings)


def validate(cfg: DictConfig) -> Checked:
    """Check every value whose schema is known without building an object: the env is
    chosen, the loop settings and the env's fields (what needs the task, such as
    ``memory.segment_steps`` against the horizon the task trains on, is checked by
    :func:`harness.build.validate`).

    Raises:
        ConfigError: One line naming the field and what is accepted.
    """
    require_env(cfg)
    settings = train_settings(cfg)
    env_class, env_config = check_env_fields(cfg)
    return Checked(settings, env_class, env_config, diagnose_settings(cfg))


def check_capture_setting(settings: TrainSettings, env_class: Any) -> None:
    """Refuse ``capture=true`` for an env that declares itself not capturable."""
    if settings.capture is True and not getattr(env_class, "capturable", True):
        note = getattr(env_class, "capture_note", "") or "it declares capturable = False"
        raise ConfigError(
            f"capture: env '{env_class.name}' cannot be captured ({note}); accepted: capture=auto or false"
        )


def segment_steps(cfg: DictConfig, env_class: Any, env_config: Any) -> int | None:
    """``memory.segment_steps`` resolved for this env (None, or steps per segment).

    Raises:
        ConfigError: One line: not null, auto or an integer in ``[1, env.horizon]``, or an env
            that cannot run in segments.
    """
    value = (cfg.get("memory") or {}).get("segment_steps")
    try:
        steps = resolve_segment_steps(value, env_config.horizon)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if steps is not None:
        why = env_class.segment_blocker(env_config)
        if why is not None:
            raise ConfigError(
                f"memory.segment_steps: env '{env_class.name}' cannot run in segments ({why}); accepted: null"
            )
    return steps


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")


def _explain_override(config_name: str, overrides: list[str], exc: BaseException) -> str:
    """One line for Hydra's "Could not override 'X'": a group chosen without its '+', or a
    key that does not exist (with the keys that do, and the closest one); else Hydra's
    first line."""
    found = _NOT_OVERRIDABLE.match(str(exc))
    if not found:
        return first_line(exc)
    key = found.group(1)
    text = next((o for o in overrides if o.split("=", 1)[0] == key), None)
    value = text.split("=", 1)[1] if text is not None and "=" in text else "NAME"
    known = groups()
    if key in known:
        return f"{key}: no {key} is chosen by default, so choosing one needs a '+': write +{key}={value}"
    try:
        base, _ = compose_config(config_name, [o for o in overrides if o is not text])
    except Exception:  # the rest of the command line does not compose either: Hydra's own words
        return first_line(exc)
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(base, parent) if parent else base
    if not isinstance(node, DictConfig):
        return first_line(exc)
    accepted = sorted({str(k) for k in node.keys()} | (set(known) if not parent else set()))
    close = difflib.get_close_matches(leaf, accepted, n=1)
    hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    what = f"no such key in {parent}" if parent else "no such key or config group"
    return f"{key}: {what}; accepted: {', '.join(accepted)}{hint}"


def _check_choice(group: str, value: Any, overrides: list[str]) -> None:
    from harness.checkpoint import current_name

    options = available(group, overrides)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if v is not None and str(v) not in options:
            new = current_name(group, str(v))
            if new != str(v) and new in options:
                raise ConfigError(f"{group}: '{v}' was renamed; use {group}={new}")
            raise ConfigError(f"{group}: '{v}' is not an option; accepted: {', '.join(options)}")


def check_writable(field: str, folder: Path) -> None:
    """Refuse, in one line, an output folder that cannot be created or written."""
    probe = folder
    try:
        while not probe.exists():
            probe = probe.parent
        probe.is_dir()
    except OSError as exc:  # a name too long, a symbolic link loop
        raise ConfigError(f"{field}: '{folder}' cannot be created ({exc.strerror or exc})") from None
    if not probe.is_dir():
        raise ConfigError(f"{field}: '{folder}' cannot be created: '{probe}' is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: '{folder}' cannot be written (no write permission on '{probe}')")


RUN_NAME_CHARS = 96
"""At most this many characters of the overrides go into a run folder's name."""


def run_name_suffix(overrides: str) -> str:
    """The end of a single run's folder name: ``_`` and its overrides (Hydra's
    ``override_dirname``, '/' replaced by '-', cut at :data:`RUN_NAME_CHARS`), or nothing
    without overrides."""
    return "_" + overrides.replace("/", "-")[:RUN_NAME_CHARS] if overrides else ""


_claimed: dict[str, str] = {}  # a default folder name -> the free name this process claimed for it
_made: list[str] = []  # the folders unique_folder created in this process, parents first


def release_unused_folders() -> list[str]:
    """Remove the folders :func:`unique_folder` created in this process that are still empty
    (a command that only prints its config, ``--cfg hydra --resolve``, resolves the run's
    folder name without writing there), deepest first; return them."""
    removed = []
    for folder in reversed(_made):
        try:
            os.rmdir(folder)  # only an empty folder
        except OSError:
            continue
        removed.append(folder)
    _made[:] = [f for f in _made if f not in removed]
    for name in [n for n, f in _claimed.items() if f in removed]:
        del _claimed[name]
    return removed


def _merge_lookup() -> bool:
    """True while OmegaConf merges a config file's value over an interpolation (an experiment's
    ``hydra.sweep.dir`` over train.yaml's ``${harness.unique:...}``): it resolves the
    interpolation only to see whether it names a config node, without failing when it cannot,
    and drops a plain value. A folder claimed then would be left empty (one per composition,
    in every sweep worker too). Found by the call: ``_maybe_dereference_node`` called from
    ``BaseContainer._map_merge`` with ``throw_on_resolution_failure=False``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_back is not None:
        caller = frame.f_back
        if (
            frame.f_code.co_name == "_maybe_dereference_node"
            and caller.f_code.co_name == "_map_merge"
            and "omegaconf" in frame.f_code.co_filename
        ):
            return frame.f_locals.get("throw_on_resolution_failure") is False
        frame = caller
    return False


def unique_folder(name: str) -> str:
    """``${harness.unique:<name>}``: ``name`` if no folder of that name exists, else the first
    free ``name_2``, ``name_3``, ...; the folder is created here (``mkdir`` without
    ``exist_ok``: of two processes that start in the same second, exactly one gets each name).
    The same ``name`` gives the same answer for the rest of the process (Hydra may resolve
    the run folder's name more than once)."""
    if name in _claimed:
        return _claimed[name]
    if _merge_lookup():
        raise LookupError("a merge looks through the folder's name: nothing is claimed")
    parent = Path(name).parent
    _made.extend(str(p) for p in reversed([parent, *parent.parents]) if not p.exists())
    parent.mkdir(parents=True, exist_ok=True)
    for k in range(1, 10_000):
        candidate = name if k == 1 else f"{name}_{k}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        _claimed[name] = candidate
        _made.append(candidate)
        return candidate
    raise ConfigError(f"harness.unique: 9999 folders named '{name}_*' exist; accepted: another folder name")


def apply_task_env_defaults(cfg: DictConfig, choices: Mapping[str, Any], overrides: list[str]) -> None:
    """Apply the chosen task's defaults for the chosen env, in place.

    A task option may hold ``per_env: {<env option>: {<dotted key>: value}}``: the
    settings that task trains that env with (``task=policy`` trains the cartpole over a
    longer horizon than the open-loop default). Hydra merges a ``+env=`` option after the
    task's, so these are applied here, after composition: over the env's and loss's own
    option values, and under the command line's overrides, which still win. The block is
    removed from ``cfg.task``. ``gradcheck.per_env`` is the same for the rollout ``harness
    gradcheck`` checks an env on (``configs/gradcheck.yaml``).
    """
    for name in PER_ENV_SECTIONS:
        section = cfg.get(name)
        if isinstance(section, DictConfig) and "per_env" in section:
            with open_dict(cfg):
                block = section.pop("per_env")
            apply_per_env(cfg, block, choices, overrides, only_held=name == "gradcheck")


_ABSENT = object()

PER_ENV_SECTIONS = ("task", "gradcheck")
"""Config sections that may hold a ``per_env`` block (:func:`apply_task_env_defaults`)."""


def apply_per_env(
    cfg: DictConfig, block: Any, choices: Mapping[str, Any], overrides: list[str], *, only_held: bool = False
) -> None:
    """Set the values ``block[<env option>]`` holds for the chosen env (``{<dotted key>: value}``)
    in ``cfg``, under the command line's overrides (a task's ``per_env``, gradcheck's).
    ``only_held``: set only keys the composed config holds (gradcheck's block serves every
    task: ``task.init_noise`` is the open-loop task's, and a task without it is checked without)."""
    values = (block or {}).get(str(choices.get("env")))
    if not values:
        return
    values = OmegaConf.to_container(values, resolve=False)  # an interpolation follows the final config
    # what the command line sets: a value (env.tilt) or a whole group's option (loss=...);
    # the env's and the task's own choices (+env=cartpole task=policy) selected these defaults
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides} - {"env", "task"}
    for key, value in values.items():
        if any(key == g or key.startswith(g + ".") for g in given):
            continue
        if only_held and OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            continue
        with open_dict(cfg):
            OmegaConf.update(cfg, key, value, merge=False)


def run_overrides(run_dir: Path, command: str) -> list[str]:
    """The command-line overrides a run folder was trained with (``.hydra/overrides.yaml``),
    less ``resume=`` and ``device=``: what ``render`` and ``evaluate`` compose its config from.
    A config group chosen under an option's old name (``clip=norm``) is read under its
    current one (:data:`harness.checkpoint.RENAMED`).

    Raises:
        ConfigError: One line: ``run_dir`` is not a run folder.
    """
    import yaml

    found = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not found.is_file():
        raise ConfigError(
            f"{command}: '{run_dir}' is not a run folder (no .hydra/overrides.yaml); accepted: outputs/<env>/<time>"
        )
    from harness.files import FileCheckError, read_small_text

    try:
        text = read_small_text(found, command, accepted="a run folder's .hydra/overrides.yaml, as Hydra writes it")
    except FileCheckError as exc:
        raise ConfigError(str(exc)) from None
    kept = [o for o in yaml.safe_load(text) or [] if not o.startswith(("resume=", "device="))]
    return [_renamed_override(o) for o in kept]


def _renamed_override(override: str) -> str:
    """``clip=norm`` as ``clip=global_norm``: an override choosing a renamed option, under its current name."""
    from harness.checkpoint import current_name

    key, sep, value = override.partition("=")
    group = key.lstrip("+~")
    return f"{key}{sep}{current_name(group, value)}" if sep else override


def divide(numerator: int, denominator: int) -> int:
    """``${harness.div:a,b}``: ``a // b`` (a config value that follows another, e.g.
    ``task.window: ${harness.div:${env.horizon},2}``, half the horizon whatever it is)."""
    return int(numerator) // int(denominator)


def multiply(*factors: int) -> int:
    """``${harness.mul:a,b,...}``: the product (SHAC's critic decays its rate over all its updates:
    ``${harness.mul:${iterations},${task.critic_epochs},${task.critic_minibatches}}``)."""
    product = 1
    for factor in factors:
        product *= int(factor)
    return product


def ray_private_only(value: Any, address: str | None) -> Any:
    """``${harness.ray_private_only:VALUE,${.address}}``: ``VALUE`` when ``ray.init(address=...)``
    starts a private Ray on this machine, else None. Ray refuses some fields
    (``object_store_memory``) when it joins a running cluster, whose nodes have their own
    (``ray start --object-store-memory``); hydra-ray-launcher sets a default for it whatever the
    address, so the preset sets it through this (configs/hydra/launcher/ray.yaml).

    Ray joins a cluster for any address but ``local``, and for none when ``RAY_ADDRESS`` names
    one or a cluster started with ``ray start`` runs on this machine (asked of Ray itself; when
    that cannot be asked, None: a field Ray then sizes itself)."""
    if address == "local":
        return value
    if address is not None or os.environ.get("RAY_ADDRESS"):
        return None
    try:
        from ray._private.services import canonicalize_bootstrap_address

        joins = canonicalize_bootstrap_address(None) is not None
    except Exception:  # Ray's own lookup changed or failed: leave the field to Ray
        return None
    return None if joins else value


def register_resolvers() -> None:
    """Register the configs' resolvers: ``harness.run_name_suffix`` and ``harness.unique``
    (:func:`unique_folder`) of ``hydra.run.dir`` and ``hydra.sweep.dir``,
    ``harness.div`` (integer division), ``harness.mul`` (a product), ``harness.ray_private_only``
    (:func:`ray_private_only`, the Ray launcher's fields for a private Ray)."""
    if not OmegaConf.has_resolver("harness.run_name_suffix"):
        OmegaConf.register_new_resolver("harness.run_name_suffix", run_name_suffix)
    if not OmegaConf.has_resolver("harness.unique"):
        # cached: a sweep's jobs (in launcher worker processes too) get the folder the launching process claimed
        OmegaConf.register_new_resolver("harness.unique", unique_folder, use_cache=True)
    if not OmegaConf.has_resolver("harness.div"):
        OmegaConf.register_new_resolver("harness.div", divide)
    if not OmegaConf.has_resolver("harness.mul"):
        OmegaConf.register_new_resolver("harness.mul", multiply)
    if not OmegaConf.has_resolver("harness.ray_private_only"):
        OmegaConf.register_new_resolver("harness.ray_private_only", ray_private_only)


def compose_config(config_name: str, overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """Compose ``configs/<config_name>.yaml`` with overrides, as the CLI would, without a run.
    The ``hydra.callbacks`` Hydra would build are checked (:func:`check_callbacks`).

    Returns:
        The config without its ``hydra`` node, and the chosen option of every config group.

    Raises:
        ConfigError: One line: a ``hydra.callbacks`` ``_target_`` that is not a Hydra callback.
    """
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name=config_name, overrides=search_path_overrides(list(overrides)), return_hydra_config=True
        )
    choices = dict(cfg.hydra.runtime.choices)
    check_callbacks(cfg.hydra.get("callbacks"))
    with open_dict(cfg):
        del cfg["hydra"]
    apply_task_env_defaults(cfg, choices, list(overrides))
    return cfg, choices


def check_callbacks(callbacks: DictConfig | None) -> None:
    """Check ``hydra.callbacks``, which Hydra builds when a run starts: each ``_target_`` a
    Hydra ``Callback`` subclass (:func:`harness.targets.check_callbacks`).

    Raises:
        ConfigError: One line naming ``hydra.callbacks.<name>._target_`` and what is accepted.
    """
    from harness import targets

    if callbacks is None:
        return
    try:
        targets.check_callbacks(OmegaConf.to_container(callbacks, resolve=False))
    except targets.TargetError as exc:
        raise ConfigError(str(exc)) from None


def compose_command(
    config_name: str, overrides: list[str], *, multirun: bool = False
) -> tuple[DictConfig, dict[str, Any], list[Any]]:
    """:func:`compose_config` for a command line, with one-line errors: the override syntax,
    every config-group choice, keys that do not exist. In a multirun only the values shared
    by all jobs are composed (the sweeps are checked as choices).

    Returns:
        The config, the group choices and the parsed overrides.

    Raises:
        ConfigError: One line naming the override and what is accepted.
    """
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(f"overrides: {first_line(exc)}") from None
    known = groups()
    for o in parsed:
        if o.key_or_group in known and not o.is_delete():
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else o.value()
            _check_choice(o.key_or_group, values, overrides)
    shared = [text for text, o in zip(overrides, parsed, strict=True) if not (multirun and o.is_sweep_override())]
    try:
        cfg, choices = compose_config(config_name, shared)
    except HydraException as exc:
        raise ConfigError(_explain_override(config_name, shared, exc)) from None
    return cfg, choices, parsed


RESUME_MAY_CHANGE = (
    "iterations",
    "log_every",
    "plot_every",
    "checkpoint",
    "device",
    "capture",
    "resume",
    "overwrite",
    "diagnose",
    "memory",
)
"""Top-level config keys a resumed run may change; everything else must match the checkpoint."""


def _first_difference(saved: Any, current: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            found = _first_difference(saved.get(key), current.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    return None if saved == current else (path, saved, current)


RENAMED_TARGETS = {"harness.clip.chain": "harness.clip.chain_clips"}
"""``_target_`` paths that changed: a saved config (a checkpoint's, a user's config file) may
still hold the old one. A checkpoint's is read under the new name; a config file's is refused
with a one-line hint (:func:`renamed_target`)."""


def renamed_target(target: Any) -> str | None:
    """The current name of a renamed ``_target_``, or None when ``target`` was not renamed."""
    return RENAMED_TARGETS.get(target) if isinstance(target, str) else None


def _current_targets(node: Any) -> Any:
    """A saved config with every renamed ``_target_`` under its current name."""
    if isinstance(node, dict):
        return {k: (renamed_target(v) or v) if k == "_target_" else _current_targets(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_current_targets(v) for v in node]
    return node


def _select(node: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _no_open_loop_noise(now: dict) -> bool:
    return _select(now, "task.init_noise") == 0.0


def _contact_damping_given(now: dict) -> bool:
    return _select(now, "env.contact_kd_depth") is not None or _select(now, "env.contact_kd") is not None


def _torque_control(now: dict) -> bool:
    return _select(now, "env.control") == "torque"


def _square_cylinders(now: dict) -> bool:
    return _select(now, "env.round_cylinders") is False


def _unlimited_drive(key: str) -> Callable[[dict], bool]:
    def unchanged(now: dict) -> bool:  # torques, or a drive limit of inf: what a drive was before limits
        value = _select(now, key)
        return _torque_control(now) or (isinstance(value, list) and all(v == math.inf for v in value))

    return unchanged


ADDED_FIELDS = {
    "task.init_noise": _no_open_loop_noise,
    "task.seed": _no_open_loop_noise,
    "env.contact_kd_depth_ratio": _contact_damping_given,
    "env.control": _torque_control,
    "env.target_scale": _torque_control,
    "env.target_ke": _torque_control,
    "env.target_kd": _torque_control,
    "env.effort_limit": _unlimited_drive("env.effort_limit"),
    "env.velocity_limit": _unlimited_drive("env.velocity_limit"),
    "env.round_cylinders": _square_cylinders,
    "env.joint_stiffness": lambda now: _select(now, "env.joint_stiffness") is None,
    "env.limit_kd_everywhere": lambda now: _select(now, "env.limit_kd_everywhere") is False,
    "env.height_scale": lambda now: _select(now, "env.height_scale") == 1.0,
    "env.nan_guard": lambda now: _select(now, "env.nan_guard") is False,
    "task.auto": lambda now: _select(now, "task.window") != "auto",
    "env.recenter": lambda now: True,
}
"""Config keys added after checkpoints were written, and when the current config's value does
what the checkpoint's run did without the key (an open-loop run without initial noise does not
read its seed; a robot whose contact damping is given does not read the ratio; a torque-controlled
robot does not read the drive's settings, and a drive limited at inf is the drive before
limits; cylinders left as cylinders; the file's joint springs, the limit damping past a limit
only, a shaped height's bonus at 1 x the height, no guard against a world's non-finite numbers, SHAC's
window fixed): a checkpoint that lacks such a key resumes
under that condition. ``env.recenter`` moves a world by whole metres, the same dynamics and loss
either way: a checkpoint from before it resumes with it on or off (on: its carried states come
back near the origin at the first reset, a continuous run though not bit for bit the one it was;
``harness.training.state.ADDED_ARRAYS``)."""

AS_WRITTEN = {"env.effort_limit": "[inf]", "env.velocity_limit": "[inf]"}
"""Added keys whose null now means something a checkpoint without them did not do (a drive
limited by the file's limits, where the run had no limit), and the value that resumes such a
checkpoint as it ran: a missing key is refused naming it, never read as the null it equals."""


def _fill_added_fields(before: dict, now: dict, path: Path) -> None:
    for dotted, unchanged in ADDED_FIELDS.items():
        parent_key, _, leaf = dotted.rpartition(".")
        parent = _select(before, parent_key)
        current = _select(now, dotted)
        if not isinstance(parent, dict) or leaf in parent:
            continue
        if unchanged(now):
            if current is not None:
                parent[leaf] = current
        elif dotted in AS_WRITTEN and _select(before, "env.control") == "position":  # (before env.control
            raise ConfigError(  # existed a robot took torques: that difference is the one refused)
                f"resume: checkpoint '{path}' was written before {dotted} existed (no limit), this run has "
                f"{dotted}={current!r}; pass {dotted}={AS_WRITTEN[dotted]} to resume it as it ran"
            )


AUTO_WINDOW_DIAGNOSE = ("samples", "segment_from", "zo_pairs", "zo_scale", "snr_min", "zo_cosine_min", "seed")
"""The ``diagnose`` settings that ``task.window=auto``'s measurements read: fixed on resume there."""


def check_saved_config(saved: Any, cfg: DictConfig, path: Path) -> None:
    """Refuse to resume when the config differs from the checkpoint's beyond :data:`RESUME_MAY_CHANGE`."""
    import yaml

    if "config" not in saved.meta:
        return
    before = _current_targets(yaml.safe_load(saved.meta["config"]))
    now = OmegaConf.to_container(cfg, resolve=True)
    if _select(now, "task.window") == "auto":  # the measurement's settings choose the window here
        for key in AUTO_WINDOW_DIAGNOSE:
            old, new = _select(before, f"diagnose.{key}"), _select(now, f"diagnose.{key}")
            if old is not None and old != new:
                raise ConfigError(
                    f"resume: checkpoint '{path}' was written with diagnose.{key}={old!r}, this run has "
                    f"diagnose.{key}={new!r}; under task.window=auto it chooses the window: pass diagnose.{key}={old!r}"
                )
    for key in RESUME_MAY_CHANGE:
        before.pop(key, None)
        now.pop(key, None)
    _fill_added_fields(before, now, path)
    found = _first_difference(before, now, "")
    if not found:
        return
    field, old, new = found
    parent_key, _, leaf = field.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if isinstance(parent, DictConfig) and leaf in parent and OmegaConf.is_interpolation(parent, leaf):
        source = OmegaConf.to_container(parent, resolve=False)[leaf]  # the interpolation's text, e.g. ${seed}
        raise ConfigError(
            f"resume: checkpoint '{path}' was written with {field}={old!r}; here {field}={source} gives {new!r}; "
            f"pass {field}={old!r} to keep the checkpoint's value"
        )
    raise ConfigError(
        f"resume: checkpoint '{path}' was written with {field}={old!r}, this run has {field}={new!r}; "
        f"only {', '.join(RESUME_MAY_CHANGE[:-1])} may change on resume"
    )


HPARAM_KEYS = (
    "env.horizon",
    "env.world_count",
    "clip.max_norm",
    "clip.clip_value",
    "optim.lr",
    "iterations",
    "seed",
)
"""Config values recorded as hyperparameters of every run (when the config has them)."""


def hparams(cfg: DictConfig, hydra_cfg: Any) -> dict[str, bool | int | float | str]:
    """The run's hyperparameters for TensorBoard's HParams dashboard.

    The chosen option of each config group (``env``, ``clip``, ``optim``, ``loss``), the
    values in :data:`HPARAM_KEYS`, and every key overridden on the command line (so a
    sweep's swept values are always there).
    """
    values: dict[str, bool | int | float | str] = {}
    for group in GROUPS:
        choice = hydra_cfg.runtime.choices.get(group)
        if choice is not None:
            values[group] = str(choice)
    keys = list(HPARAM_KEYS)
    for override in OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task)):
        key = override.key_or_group
        if "/" not in key and key not in values and key not in keys:
            keys.append(key)
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # HParams stores numbers as finite doubles; "inf" stays readable
        elif key.rsplit(".", 1)[-1] == "seed" and isinstance(value, int):
            value = str(value)  # a replicate's name, not a quantity: "3" (HParams prints a number as "3.0000")
        if isinstance(value, bool | int | float | str):
            values[key] = value
    return values


def swept_keys(hydra_cfg: Any) -> list[str]:
    """In a multirun job, the hyperparameters that differ between the sweep's jobs: its
    overrides that name the job folder (the fixed ones are excluded from it). Empty for a
    single run."""
    if hydra_cfg.mode.name != "MULTIRUN":
        return []
    excluded = set(hydra_cfg.job.config.override_dirname.exclude_keys)
    parsed = OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task))
    return [o.key_or_group for o in parsed if o.key_or_group not in excluded]


def resolved_yaml(cfg: DictConfig) -> str:
    """The run's config with every interpolation resolved, as YAML."""
    return OmegaConf.to_yaml(cfg, resolve=True)
