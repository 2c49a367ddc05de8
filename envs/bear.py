"""Newton's diffsim bear: a soft tetrahedral bear learns to walk, driven by a small network.

A port of ``newton/examples/diffsim/example_diffsim_bear.py`` (newton 1.8). The bear is the
tetrahedral mesh of Newton's ``bear.usd`` (1986 particles, 5354 tetrahedra; read with Pixar's
``usd-core``), placed 0.5 m up, density 1, Neo-Hookean ``k_mu = k_lambda = 2000``, ``k_damp = 2``
(triangles ``tri_ka = 1e-8``, the rest 0), on a ground plane with soft contacts ke = 2e3,
kf = 10, kd = 0.1, mu = 0.7 found once from the initial pose (``soft_contact_gap`` 10 m: every
particle is in the set). ``SolverSemiImplicit`` without triangle or particle-particle contact,
``frames`` frames of ``substeps`` = 80 steps at dt = 1/60/80 s (the example's ``--sim-steps``,
300 by default: 24,000 steps).

Every tetrahedron's muscle activation for frame ``f`` is one output of a linear layer and a
scaled tanh, ``0.3 tanh(W p_f)``, where ``p_f`` holds 8 phases ``sin(5 s + 2 pi k / 8)`` at the
frame's start time ``s`` and ``W`` (5360 x 8: the tetrahedra padded to a multiple of 8 rows, as
the example's tile kernel reads them) is the trained quantity ``activation_weights``
(``task=physical``), starting from the example's draw, ``uniform(+-sqrt(1/8))`` of numpy's
generator seeded 42. The activations of all frames are computed once per rollout, before
step 0 (they depend on the weights and the time only), one tile per 8 tetrahedra and frame.

The loss is the example's: over the frames, the sum of ``|v_y| + |v_z| - v_x`` of the mean
particle velocity at the end of the frame (unbounded below: the bear walks along x). The
observable ``gait`` holds that frame's term at the last step of every frame (0 at the others)
and the default loss (``configs/loss/bear.yaml``) sums it.

Segments: every per-step array is indexed by its segment slot and every per-frame read picks
its frame from the device step, so one captured segment serves every segment whatever
``memory.segment_steps`` is (``segment_graph``): the example's 300 frames train in bounded
memory (docs/envs.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import warp as wp

from harness.env import EnvConfig, Quantity, Segmentable, Trajectory
from harness.newton_env import NewtonEnv, NewtonEnvConfig
from harness.schema import SchemaError, field

if TYPE_CHECKING:  # newton is imported where a simulation is built: the config's checks do without it
    import newton

PHASES = 8
"""Inputs of the network: sine phases 2 pi / 8 apart."""

TILE_TETS = 8
"""Tetrahedra per tile of the network kernel (its rows are padded to a multiple)."""

TILE_THREADS = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class BearConfig(NewtonEnvConfig):
    """``configs/env/bear.yaml``."""

    frames: int = field(300, minimum=1, doc="frames of 1/60 s (the example's --sim-steps)")
    substeps: int = field(80, minimum=1, doc="simulation steps per frame")
    horizon: int = field(24000, minimum=1, doc="simulation steps: frames x substeps (the memory check probes fewer)")
    world_count: int = field(1, minimum=1, maximum=1, doc="one bear (the network's weights are the bear's)")
    frame_dt: float = field(1.0 / 60.0, minimum=0.0, strict=True, doc="length of a frame [s]")
    phase_frequency: float = field(5.0, doc="angular frequency of the phases [rad/s]")

    def __post_init__(self) -> None:
        if self.horizon > self.frames * self.substeps:
            raise SchemaError(
                f"env.horizon: {self.horizon} is more than env.frames x env.substeps = {self.frames * self.substeps}; "
                "accepted: env.frames x env.substeps, as the config sets it (a shorter horizon ends inside the frames)"
            )
        try:
            found = importlib.util.find_spec("pxr")
        except ImportError:  # a finder that refuses it
            found = None
        if found is None:
            raise SchemaError(
                "env: bear reads bear.usd with Pixar's usd-core (module pxr), which is not installed; "
                "accepted: pip install usd-core (the project's own set-up installs it)"
            )

    @property
    def dt(self) -> float:
        return self.frame_dt / self.substeps

    def observable_dims(self) -> dict[str, int]:
        return {"gait": 1}

    def quantities(self) -> dict[str, Quantity]:
        return {
            "activation_weights": Quantity(
                (padded_tets(), PHASES),
                doc="weights of the linear layer from the 8 phases to every tetrahedron's activation",
                fd_step=1.0e-2,
            )
        }

    def default_quantities(self, kind: str) -> list[str]:
        return ["activation_weights"] if kind == "physical" else []


def padded_tets() -> int:
    """The bear's tetrahedra (5354) rounded up to a multiple of :data:`TILE_TETS`."""
    return math.ceil(5354 / TILE_TETS) * TILE_TETS


def bear_mesh() -> tuple[list[Any], list[int]]:
    """The vertices and tetrahedron indices of Newton's ``bear.usd`` (needs ``usd-core``)."""
    import newton.examples
    from pxr import Usd, UsdGeom

    stage = Usd.Stage.Open(newton.examples.get_asset("bear.usd"))
    mesh = UsdGeom.Mesh(stage.GetPrimAtPath("/root/bear/bear"))
    points = [wp.vec3(p) for p in mesh.GetPointsAttr().Get()]
    return points, list(mesh.GetPrim().GetAttribute("tetraIndices").Get())


@wp.kernel
def _phases(times: wp.array(dtype=wp.float32), frequency: float, spacing: float, phases: wp.array2d(dtype=wp.float32)):
    # phases[k, f] = sin(frequency s_f + k spacing), one column per frame (the tile kernel reads columns)
    k, f = wp.tid()
    phases[k, f] = wp.sin(frequency * times[f] + wp.float32(k) * spacing)


@wp.func
def _scaled_tanh(x: float):
    return wp.tanh(x) * 0.3  # the example's activation strength


@wp.kernel
def _network(
    phases: wp.array2d(dtype=wp.float32),
    weights: wp.array2d(dtype=wp.float32),
    tiles: int,
    frames: int,
    activations: wp.array2d(dtype=wp.float32),
):
    # One tile of 8 tetrahedra of one frame: activations = 0.3 tanh(W p). Frames run from the last
    # to the first, so the adjoint adds the frames' gradients into W in the order a backward pass
    # over one launch per frame adds them (the example's).
    i = wp.tid()
    frame = frames - 1 - i // tiles
    block = i % tiles
    p = wp.tile_load(phases, shape=(PHASES, 1), offset=(0, frame))
    w = wp.tile_load(weights, shape=(TILE_TETS, PHASES), offset=(block * TILE_TETS, 0))
    out = wp.tile_map(_scaled_tanh, wp.tile_matmul(w, p))
    wp.tile_store(activations, out, offset=(block * TILE_TETS, frame))


@wp.kernel
def _frame_activations(
    activations: wp.array2d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    substeps: int,
    out: wp.array(dtype=wp.float32),
):
    # the activations of the frame that step base + slot belongs to
    tet = wp.tid()
    out[tet] = activations[tet, (base[0] + slot) // substeps]


@wp.kernel
def _clear_mean(base: wp.array(dtype=wp.int32), slot: int, substeps: int, mean: wp.array(dtype=wp.vec3)):
    # at the last step of a frame: a fresh sum for the frame's mean velocity (a re-run segment sums again)
    step = base[0] + slot
    if (step + 1) % substeps == 0:
        mean[step // substeps] = wp.vec3(0.0)


@wp.kernel
def _add_mean(
    particle_qd: wp.array(dtype=wp.vec3),
    base: wp.array(dtype=wp.int32),
    slot: int,
    substeps: int,
    mean: wp.array(dtype=wp.vec3),
):
    # at the last step of a frame: every particle adds its share of the mean velocity (the example's sum)
    i = wp.tid()
    step = base[0] + slot
    if (step + 1) % substeps == 0:
        wp.atomic_add(mean, step // substeps, particle_qd[i] / wp.float32(particle_qd.shape[0]))


@wp.kernel
def _gait(
    mean: wp.array(dtype=wp.vec3),
    base: wp.array(dtype=wp.int32),
    slot: int,
    substeps: int,
    row: int,
    out: wp.array3d(dtype=wp.float32),
):
    # at the last step of a frame: |v_y| + |v_z| - v_x of the frame's mean velocity; nothing at the others
    step = base[0] + slot
    if (step + 1) % substeps == 0:
        v = mean[step // substeps]
        out[base[0] + row, 0, 0] = wp.abs(v[1]) + wp.abs(v[2]) - v[0]


class BearEnv(NewtonEnv, Segmentable):
    """The diffsim bear; see :class:`BearConfig` for the fields."""

    name = "bear"
    Config = BearConfig
    segment_graph = True  # every per-step and per-frame row is picked from the device step

    CONTACT: ClassVar[dict[str, float]] = {"ke": 2.0e3, "kf": 10.0, "kd": 0.1, "mu": 0.7}

    def __init__(self, config: EnvConfig | None = None, /, *, device: wp.context.Devicelike = None, **fields: Any):
        import newton

        super().__init__(config, device=device, **fields)
        cfg = self.config
        self.dt = cfg.dt
        tets = self.model.tet_count
        self.padded = math.ceil(tets / TILE_TETS) * TILE_TETS
        if self.padded != padded_tets():
            raise RuntimeError(f"bear.usd has {tets} tetrahedra, expected 5354")
        rng = np.random.default_rng(42)  # the example's initial weights
        bound = np.sqrt(1.0 / PHASES)
        self._built_weights = rng.uniform(-bound, bound, (self.padded, PHASES)).astype(np.float32)
        grad = dict(dtype=wp.float32, device=self.device, requires_grad=True)
        self.weights = wp.zeros((self.padded, PHASES), **grad)
        self.activations = wp.zeros((self.padded, cfg.frames), **grad)
        self.step_activations = wp.zeros((self.steps_kept, tets), **grad)
        self.mean = wp.zeros(cfg.frames, dtype=wp.vec3, device=self.device, requires_grad=True)  # per frame
        # each frame's start time as the example accumulates it (a float64 sum of the steps)
        times, now = np.zeros(cfg.frames), 0.0
        for f in range(cfg.frames):
            times[f] = now
            for _ in range(cfg.substeps):
                now += cfg.dt
        self.phases = wp.zeros((PHASES, cfg.frames), dtype=wp.float32, device=self.device)
        wp.launch(
            _phases, dim=(PHASES, cfg.frames), inputs=[wp.array(times, dtype=wp.float32, device=self.device),
            cfg.phase_frequency, 2.0 * math.pi / PHASES], outputs=[self.phases], device=self.device,
        )  # fmt: skip
        self.collision_pipeline = newton.CollisionPipeline(
            self.model, broad_phase="explicit", soft_contact_gap=10.0, requires_grad=True
        )
        self.contacts = self.collision_pipeline.contacts()
        self.collision_pipeline.collide(self.states[0], self.contacts)

    def build_model(self) -> newton.Model:
        import newton

        points, indices = bear_mesh()
        scene = newton.ModelBuilder()
        scene.add_soft_mesh(
            pos=wp.vec3(0.0, 0.0, 0.5), rot=wp.quat_identity(), scale=1.0, vel=wp.vec3(0.0, 0.0, 0.0),
            vertices=points, indices=indices, density=1.0, k_mu=2000.0, k_lambda=2000.0, k_damp=2.0,
            tri_ke=0.0, tri_ka=1e-8, tri_kd=0.0, tri_drag=0.0, tri_lift=0.0,
        )  # fmt: skip
        contact = self.CONTACT
        scene.add_ground_plane(
            cfg=newton.ModelBuilder.ShapeConfig(ke=contact["ke"], kf=contact["kf"], kd=contact["kd"], mu=contact["mu"])
        )
        model = scene.finalize(device=self.device, requires_grad=True)
        model.soft_contact_ke = contact["ke"]
        model.soft_contact_kf = contact["kf"]
        model.soft_contact_kd = contact["kd"]
        model.soft_contact_mu = contact["mu"]
        model.particle_grid = None  # particle-particle contact has no correct gradient in SolverSemiImplicit
        return model

    def build_solver(self) -> newton.solvers.SolverSemiImplicit:
        import newton

        return newton.solvers.SolverSemiImplicit(self.model, enable_tri_contact=False)

    # -- the network ---------------------------------------------------------------------

    def quantity_value(self, name: str) -> np.ndarray:
        if name != "activation_weights":
            return super().quantity_value(name)
        return self._built_weights.copy()

    def set_quantity(self, name: str, value: wp.array) -> None:
        if name != "activation_weights":
            super().set_quantity(name, value)
            return
        wp.copy(self.weights, value)

    def reset(self) -> None:
        super().reset()
        tiles = self.padded // TILE_TETS
        frames = self.config.frames
        wp.launch_tiled(
            _network, dim=frames * tiles, inputs=[self.phases, self.weights, tiles, frames],
            outputs=[self.activations], block_dim=TILE_THREADS, device=self.device,
        )  # fmt: skip

    # -- a rollout -----------------------------------------------------------------------------

    def step(self, t: int) -> None:
        slot = self.slot(t)
        active = self.step_activations[slot]
        wp.launch(
            _frame_activations, dim=self.model.tet_count,
            inputs=[self.activations, self.segment_base, slot, self.config.substeps], outputs=[active],
            device=self.device,
        )  # fmt: skip
        self.control.tet_activations = active
        super().step(t)

    def contacts_at(self, t: int) -> newton.Contacts:
        return self.contacts

    def write_observables(self, t: int) -> None:
        row = self.row("gait", t)
        if row is None:
            return
        # launched at every step, acting at the last step of a frame only (the device step decides:
        # one captured segment serves every segment)
        slot, substeps = self.slot(t), self.config.substeps
        device = self.device
        wp.launch(_clear_mean, dim=1, inputs=[self.segment_base, slot, substeps], outputs=[self.mean], device=device)
        wp.launch(
            _add_mean, dim=self.model.particle_count,
            inputs=[self.state(t + 1).particle_qd, self.segment_base, slot, substeps], outputs=[self.mean],
            device=device,
        )  # fmt: skip
        wp.launch(
            _gait, dim=1, inputs=[self.mean, self.segment_base, slot, substeps, row - self._base],
            outputs=[self.observed["gait"]], device=device,
        )  # fmt: skip

    def step_arrays(self) -> list[wp.array]:
        return [self.step_activations]

    def extra_arrays(self) -> list[wp.array]:
        contacts = [v for v in vars(self.contacts).values() if isinstance(v, wp.array)]
        return [self.weights, self.activations, self.mean, *contacts]

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        if "gait" not in trajectory:
            return {}
        gait = trajectory["gait"].numpy()[:, 0, 0].astype(np.float64)
        q = self.state(self.horizon).particle_q.numpy() if self.segment_steps is None else None
        found = {"gait_sum": float(gait.sum())}
        if q is not None:
            start = self.initial["particle_q"].numpy()
            found["com_travel_m"] = np.round(q.mean(axis=0) - start.mean(axis=0), 4).tolist()
        return found
