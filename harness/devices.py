"""Which Warp device a run uses: the names accepted for ``device=``, and the choice ``null`` makes.

Names are Warp's own: ``cpu``, ``cuda:N`` (every CUDA device Warp lists), and ``cuda``, which
Warp reads as the current CUDA device (``cuda:0`` unless a program changed it). A name is
resolved to the device's alias (``cuda`` to ``cuda:0``) once the config is checked, so a run,
its memory check and its files name one device.

``device=null`` chooses the device that runs *this* run faster (:func:`choose`). Without a
CUDA device, that is the CPU. With one, the rule is the run's world count against
:data:`GPU_MIN_WORLDS`: the harness's iteration on a GPU is bound by kernel launches, not by
arithmetic (about 40 launches, copies and memsets per simulated step of the cartpole, each a
few microseconds however few worlds it covers), so a GPU's iteration takes about as long at 4
worlds as at a few thousand, while the CPU's grows with the worlds. docs/gpu.md ("Which device null picks") has the
measurements behind the threshold: the one GPU measurement the project has (an H200, `make
train`'s cartpole at 4 worlds: 5.77 it/s) and this CPU's cartpole at growing world counts.
The rule does not look at the env's bodies or contacts; ``device=cpu`` or ``device=cuda``
always wins over it.
"""

from __future__ import annotations

__all__ = ["GPU_MIN_WORLDS", "DeviceError", "check", "choose", "listed", "resolve"]

GPU_MIN_WORLDS = 40
"""``device=null`` picks a CUDA device (when there is one) for runs of at least this many
worlds, the CPU below (docs/gpu.md, "Which device null picks")."""


class DeviceError(ValueError):
    """A device name that is not here: one line listing what is."""


def listed() -> list[tuple[str, bool]]:
    """Every device Warp sees, as (alias, is CUDA), the CPU first."""
    import warp as wp

    from harness import init_warp

    init_warp(check_environment=False)  # Warp lists its devices once initialised: no CUDA driver warning
    return [(d.alias, bool(d.is_cuda)) for d in wp.get_devices()]


def current_cuda() -> str:
    """The alias of the device Warp means by ``cuda`` (its current CUDA device)."""
    import warp as wp

    return wp.get_device("cuda").alias


def accepted() -> list[str]:
    """The names ``device=`` accepts here, null aside."""
    found = listed()
    names = [alias for alias, _ in found]
    if any(cuda for _, cuda in found):
        names.insert(1, "cuda")
    return names


def check(name: str | None) -> str | None:
    """``name`` as the alias of a device Warp sees (``cuda`` -> the current CUDA device's), or None.

    Raises:
        DeviceError: No such device here; the line lists the names accepted.
    """
    if name is None:
        return None
    name = str(name)
    names = accepted()
    if name not in names:
        raise DeviceError(
            f"device: '{name}' is not available here; accepted: null (the faster for the run), {', '.join(names)}"
        )
    return current_cuda() if name == "cuda" else name


def resolve(name: str | None, world_count: int) -> tuple[str, str]:
    """The device a run of ``world_count`` worlds uses with ``device=name`` (a checked name, or
    None: :func:`choose`), and why (a phrase for the run's first line)."""
    if name is not None:
        return name, f"device={name}"
    return choose(world_count)


def choose(world_count: int) -> tuple[str, str]:
    """The device ``device=null`` runs a run of ``world_count`` worlds on, and why (a phrase
    for the run's first line)."""
    found = listed()
    cuda = [alias for alias, is_cuda in found if is_cuda]
    if not cuda:
        return "cpu", "null: no CUDA device here"
    gpu = current_cuda()
    if world_count >= GPU_MIN_WORLDS:
        return gpu, f"null: {world_count} worlds, at least the {GPU_MIN_WORLDS} from which a GPU outruns the CPU"
    return "cpu", (
        f"null: {world_count} worlds, under the {GPU_MIN_WORLDS} from which {gpu} outruns the CPU; "
        f"device={gpu} to use it anyway"
    )
