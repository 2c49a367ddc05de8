"""The robot env's Warp kernels and functions, beside the thin host class in :mod:`envs.robot.env`.

Every launch of a control step is here: the action into the step's torques or drive targets
(:func:`apply_actions`), ``control: position``'s torque-limited drive on every substep
(:func:`drive`), the observation (:func:`observe`), the step's observables
(:func:`record`), the termination flags (:func:`flag_ends`, :func:`survive`), the contacts'
marks, load and Hunt-Crossley damping (:func:`mark_contacts`, :func:`contact_load`,
:func:`hunt_crossley`) and the device draw of fresh starts (:func:`draw_starts`). An
observation's columns and a reward's terms carry the codes of :class:`~envs.robot.config.Piece`
and :class:`~envs.robot.config.Term`, and the kernels branch on those names. What ends an
episode is written once, :func:`ends`, and every kernel that asks calls it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import warp as wp

from envs.robot.config import Piece, Term

if TYPE_CHECKING:
    import newton


@wp.func
def axis_of(q: wp.quat, axis: wp.vec3, world: wp.vec3) -> float:
    """``(q rotates axis) . world``: how far a body axis points along a world direction."""
    return wp.dot(wp.quat_rotate(q, axis), world)


# -- termination -----------------------------------------------------------------------------------


@wp.struct
class Termination:
    """What ends a world's episode (:func:`termination`, built once per env): its root body (``root``,
    of ``body_count`` per world) below ``height`` along ``up``, its up axis below ``up_min`` along
    ``up``, or a height that is not finite."""

    root: int
    body_count: int
    up: wp.vec3
    height: float
    up_min: float


def termination(root: int, body_count: int, up: wp.vec3, height: float | None, up_min: float | None) -> Termination:
    """The rule as the kernels read it; a threshold of None never ends an episode (-inf)."""
    rule = Termination()
    rule.root, rule.body_count, rule.up = root, body_count, up
    rule.height = -math.inf if height is None else float(height)
    rule.up_min = -math.inf if up_min is None else float(up_min)
    return rule


@wp.func
def ends(X: wp.transform, rule: Termination) -> bool:
    """Whether a world whose root body is at ``X`` ends its episode: the termination rule, the only
    place it is written (:func:`record`, :func:`flag_ends` and :func:`survive` call it)."""
    height = wp.dot(wp.transform_get_translation(X), rule.up)
    low = height < rule.height or axis_of(wp.transform_get_rotation(X), rule.up, rule.up) < rule.up_min
    return low or not wp.isfinite(height)


@wp.kernel
def flag_ends(body_q: wp.array(dtype=wp.transform), rule: Termination, out: wp.array(dtype=wp.int32)):
    # 1 where world w's state ends its episode (the Terminates role; no gradient)
    w = wp.tid()
    out[w] = wp.where(ends(body_q[w * rule.body_count + rule.root], rule), 1, 0)


@wp.kernel
def survive(
    body_q: wp.array(dtype=wp.transform),
    rule: Termination,
    before: wp.array(dtype=wp.float32),
    after: wp.array(dtype=wp.float32),
    touching: wp.array(dtype=wp.int32),
    nonfinite: wp.array(dtype=wp.int32),
):
    # alive after the step: alive before it, and the step's result does not end the episode; the
    # world's row of the step's contact marks cleared for mark_contacts (no gradient: an int array;
    # in this launch rather than a memset of its own); a count of the worlds whose root went nan or inf
    w = wp.tid()
    X = body_q[w * rule.body_count + rule.root]
    after[w] = wp.where(ends(X, rule), 0.0, before[w])
    for b in range(rule.body_count):
        touching[w * rule.body_count + b] = 0
    if not wp.isfinite(wp.transform_get_translation(X)):
        wp.atomic_add(nonfinite, 0, 1)


@wp.kernel
def finite_adjoint(grad: wp.array(dtype=wp.float32)):
    # nan and +-inf in an adjoint become 0 (torch.nan_to_num(grad, 0, 0, 0): DiffRL's nan_state_fix)
    i = wp.tid()
    if not wp.isfinite(grad[i]):
        grad[i] = 0.0


# -- actions, observations, observables ------------------------------------------------------------


@wp.kernel
def apply_actions(
    actions: wp.array3d(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    slot: int,
    index: wp.array(dtype=wp.int32),
    rest: wp.array(dtype=wp.float32),
    scale: wp.array(dtype=wp.float32),
    stride: int,
    out: wp.array(dtype=wp.float32),
    prev_action: wp.array(dtype=wp.float32),
):
    # out[index] = rest[index] + scale x the clipped action: joint_f (dofs, rest 0, the torques) or
    # joint_target_q (coordinates, rest the start pose, target_scale). The step's row is
    # base[0] + slot (segment graphs: the same launch for every segment).
    w, i = wp.tid()
    a = wp.clamp(actions[base[0] + slot, w, i], -1.0, 1.0)
    out[w * stride + index[i]] = rest[index[i]] + a * scale[i]
    prev_action[w * index.shape[0] + i] = a


@wp.struct
class Drive:
    """``control: position``'s drive, per actuated dof (:func:`drive`, built once per env): its
    coordinate and dof within a world, gains, joint limits, effort limit and the speed at which its
    torque in the direction of motion falls to zero (1e30 where there is none)."""

    coords: wp.array(dtype=wp.int32)
    dofs: wp.array(dtype=wp.int32)
    ke: wp.array(dtype=wp.float32)
    kd: wp.array(dtype=wp.float32)
    lower: wp.array(dtype=wp.float32)
    upper: wp.array(dtype=wp.float32)
    effort: wp.array(dtype=wp.float32)
    speed: wp.array(dtype=wp.float32)
    coord_count: int
    dof_count: int


@wp.func
def drive_torque(q: float, qd: float, target: float, ke: float, kd: float, lower: float, upper: float,
                 effort: float, speed: float) -> float:  # fmt: skip
    """One dof's drive torque: the PD law of Newton's joint drive, ``ke (target - q) - kd qd``, cut
    to 0 where the joint is past a limit (as Newton's ``joint_force`` does), then held inside a DC
    motor's envelope: ``[-effort, effort]`` at rest, the bound in the direction of motion falling
    linearly to 0 at ``speed`` (the linear torque-speed curve of a DC motor whose stall torque is
    ``effort`` and no-load speed ``speed``); braking against the motion keeps the full ``effort``."""
    tau = ke * (target - q) - kd * qd
    if q < lower or q > upper:
        tau = 0.0
    hi = effort
    lo = -effort
    if speed < 1.0e30:
        hi = wp.clamp(effort * (1.0 - qd / speed), 0.0, effort)
        lo = wp.clamp(effort * (-1.0 - qd / speed), -effort, 0.0)
    return wp.clamp(tau, lo, hi)


@wp.kernel
def drive(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    target: wp.array(dtype=wp.float32),
    d: Drive,
    joint_f: wp.array(dtype=wp.float32),
):
    # One substep's drive torque of world w's actuated dof i into the substep's joint_f (on the
    # tape: the gradient reaches the state and the step's targets through it; on the effort bound the
    # target gets none, on the speed line the speed gets the line's slope)
    w, i = wp.tid()
    c = w * d.coord_count + d.coords[i]
    k = w * d.dof_count + d.dofs[i]
    joint_f[k] = drive_torque(joint_q[c], joint_qd[k], target[c], d.ke[i], d.kd[i], d.lower[i], d.upper[i],
                              d.effort[i], d.speed[i])  # fmt: skip


@wp.kernel
def drive_load(
    torques: wp.array2d(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    d: Drive,
    base: wp.array(dtype=wp.int32),
    offset: int,
    out: wp.array3d(dtype=wp.float32),
):
    # world w's step as the drive met it, into the observable `drive`'s row base[0] + offset: the
    # largest |torque| / effort limit and |torque| over the step's substeps and actuated dofs, and
    # the largest |joint speed| of an actuated dof at the step's end (no gradient: a report)
    w = wp.tid()
    ratio = wp.float32(0.0)
    peak = wp.float32(0.0)
    speed = wp.float32(0.0)
    for k in range(torques.shape[0]):
        for i in range(d.dofs.shape[0]):
            tau = wp.abs(torques[k, w * d.dof_count + d.dofs[i]])
            ratio = wp.max(ratio, tau / d.effort[i])
            peak = wp.max(peak, tau)
    for i in range(d.dofs.shape[0]):
        speed = wp.max(speed, wp.abs(joint_qd[w * d.dof_count + d.dofs[i]]))
    row = base[0] + offset
    out[row, w, 0] = ratio
    out[row, w, 1] = peak
    out[row, w, 2] = speed


@wp.kernel
def observe(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    prev_action: wp.array(dtype=wp.float32),
    codes: wp.array(dtype=wp.int32),
    index: wp.array(dtype=wp.int32),
    scale: wp.array(dtype=wp.float32),
    root: int,
    body_count: int,
    coord_count: int,
    dof_count: int,
    action_count: int,
    up: wp.vec3,
    forward: wp.vec3,
    guard: int,
    root_offset: wp.array(dtype=wp.float32),
    out: wp.array2d(dtype=wp.float32),
):
    # One column of one world's observation: the piece `codes[c]`, its entry `index[c]`; 0 for a
    # world whose root is not finite under env.nan_guard (nothing of its state read, so no gradient).
    # root_offset: env.recenter's per-world shift (3 per world; empty without it), added to the position
    w, c = wp.tid()
    code, i = codes[c], index[c]
    X = body_q[w * body_count + root]
    if guard != 0 and not wp.isfinite(wp.transform_get_translation(X)):
        out[w, c] = 0.0
        return
    v = body_qd[w * body_count + root]
    value = wp.float32(0.0)
    if code == Piece.ROOT_HEIGHT:
        value = wp.dot(wp.transform_get_translation(X), up)
    elif code == Piece.ROOT_POSITION:
        value = wp.transform_get_translation(X)[i]
        if root_offset.shape[0] > 0:
            value = value + root_offset[w * 3 + i]
    elif code == Piece.ROOT_ROTATION:
        value = wp.transform_get_rotation(X)[i]
    elif code == Piece.ROOT_LINEAR_VELOCITY:
        value = wp.spatial_top(v)[i]
    elif code == Piece.ROOT_ANGULAR_VELOCITY:
        value = wp.spatial_bottom(v)[i]
    elif code == Piece.JOINT_Q or code == Piece.ROOT_Q:
        value = joint_q[w * coord_count + i]
    elif code == Piece.JOINT_QD or code == Piece.ROOT_QD:
        value = joint_qd[w * dof_count + i]
    elif code == Piece.UP:
        value = axis_of(wp.transform_get_rotation(X), up, up)
    elif code == Piece.HEADING:
        value = axis_of(wp.transform_get_rotation(X), forward, forward)
    else:  # Piece.PREVIOUS_ACTION
        value = prev_action[w * action_count + i]
    out[w, c] = scale[c] * value


@wp.func
def pitch_of(q: wp.quat, up: wp.vec3, forward: wp.vec3) -> float:
    """The angle [rad] of the root's forward axis below the horizontal, in the plane of ``forward`` and
    ``up`` (a planar robot's hinge about the axis across ``forward``; 0 when level)."""
    f = wp.quat_rotate(q, forward)
    return wp.atan2(-wp.dot(f, up), wp.dot(f, forward))


@wp.func
def height_shaped(h: float, cap: float, penalty: float, scale: float) -> float:
    """DiffRL's height reward (its Hopper's and Humanoid's ``calculateReward``): ``h`` clipped to
    [-1, cap], ``scale h`` above zero (its ``height_rew_scale``) and ``-penalty h^2`` below."""
    x = wp.clamp(h, -1.0, cap)
    return wp.where(x < 0.0, -penalty * x * x, scale * x)


@wp.kernel
def record(
    joint_q: wp.array(dtype=wp.float32),
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    prev_action: wp.array(dtype=wp.float32),
    terms: wp.array(dtype=wp.int32),
    weights: wp.array(dtype=wp.float32),
    limit_coords: wp.array(dtype=wp.int32),
    lower: wp.array(dtype=wp.float32),
    upper: wp.array(dtype=wp.float32),
    root: int,
    body_count: int,
    coord_count: int,
    action_count: int,
    up: wp.vec3,
    forward: wp.vec3,
    height_reference: float,
    height_cap: float,
    height_penalty: float,
    height_scale: float,
    rule: Termination,
    guard: int,
    alive: wp.array(dtype=wp.float32),
    root_offset: wp.array(dtype=wp.float32),
    base: wp.array(dtype=wp.int32),
    offset: int,
    reward: wp.array3d(dtype=wp.float32),
    root_position: wp.array3d(dtype=wp.float32),
    terminated: wp.array3d(dtype=wp.float32),
):
    # Row base[0] + offset of the step's observables, for one world: every weighted reward term
    # (0 once the world's episode has ended before the step: alive), the root's position, and
    # whether the state ends the episode (no gradient through that). The position adds env.recenter's
    # per-world shift (root_offset, 3 per world; empty without it).
    w = wp.tid()
    row = base[0] + offset
    X = body_q[w * body_count + root]
    p = wp.transform_get_translation(X)
    q = wp.transform_get_rotation(X)
    broken = guard != 0 and not wp.isfinite(p)  # env.nan_guard: its every term 0 (some would read finite)
    for k in range(terms.shape[0]):
        code = terms[k]
        value = wp.float32(0.0)
        if code == Term.FORWARD_VELOCITY:
            value = wp.dot(wp.spatial_top(body_qd[w * body_count + root]), forward)
        elif code == Term.UPRIGHT:
            value = axis_of(q, up, up)
        elif code == Term.HEADING:
            value = axis_of(q, forward, forward)
        elif code == Term.HEIGHT:
            value = wp.dot(p, up) - height_reference
        elif code == Term.ACTION_COST:
            for i in range(action_count):
                a = prev_action[w * action_count + i]
                value = value - a * a
        elif code == Term.JOINT_LIMIT_COST:
            for i in range(limit_coords.shape[0]):
                x = joint_q[w * coord_count + limit_coords[i]]
                over = wp.max(x - upper[i], 0.0) + wp.max(lower[i] - x, 0.0)
                value = value - over * over
        elif code == Term.HEIGHT_SHAPED:
            value = height_shaped(wp.dot(p, up) - height_reference, height_cap, height_penalty, height_scale)
        elif code == Term.PITCH_COST:
            pitch = pitch_of(q, up, forward)
            value = -pitch * pitch
        else:  # Term.ALIVE
            value = 1.0
        if broken or (guard != 0 and not wp.isfinite(value)):
            value = 0.0  # env.nan_guard: a world whose state went non-finite is rewarded 0 for the step
        reward[row, w, k] = weights[k] * value * alive[w]
    for d in range(3):
        shift = wp.float32(0.0)
        if root_offset.shape[0] > 0:
            shift = root_offset[w * 3 + d]
        root_position[row, w, d] = p[d] + shift
    terminated[row, w, 0] = wp.where(ends(X, rule), 1.0, 0.0)


# -- recentring (env.recenter) ----------------------------------------------------------------------


@wp.func
def ground_shift(x: float, on: float, grid: float) -> float:
    """The whole multiple of ``grid`` nearest ``x`` along a ground axis (``on`` 1), else 0 (``on`` 0, or
    ``x`` not finite)."""
    if on == 0.0 or not wp.isfinite(x):
        return 0.0
    return grid * wp.rint(x / grid)


@wp.kernel
def recenter(
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    offset: wp.array(dtype=wp.float32),
    translation: wp.vec3i,
    ground: wp.vec3,
    grid: float,
    coord_count: int,
    dof_count: int,
    body_count: int,
    out_q: wp.array(dtype=wp.float32),
    out_qd: wp.array(dtype=wp.float32),
    out_body_q: wp.array(dtype=wp.transform),
    out_body_qd: wp.array(dtype=wp.spatial_vector),
    out_offset: wp.array(dtype=wp.float32),
):
    # One world's state moved along the ground (`ground`: 1 on the two ground axes) by the whole
    # multiple of `grid` nearest its floating base's position (`translation`: that position's three
    # coordinates in the world's block of joint_q): the coordinates and every body's pose shifted, the
    # twists copied (translation-invariant), the shift added to the world's offset. A coordinate that
    # is not finite is not moved. The shift carries no gradient (rint's derivative is 0), so the
    # adjoint is the identity from each output to its input. Out of place: the solver's adjoint
    # replays reads of the unshifted poses it wrote.
    w = wp.tid()
    s = wp.vec3(
        ground_shift(joint_q[w * coord_count + translation[0]], ground[0], grid),
        ground_shift(joint_q[w * coord_count + translation[1]], ground[1], grid),
        ground_shift(joint_q[w * coord_count + translation[2]], ground[2], grid),
    )
    for i in range(coord_count):
        value = joint_q[w * coord_count + i]
        if i == translation[0]:
            value = value - s[0]
        elif i == translation[1]:
            value = value - s[1]
        elif i == translation[2]:
            value = value - s[2]
        out_q[w * coord_count + i] = value
    for i in range(dof_count):
        out_qd[w * dof_count + i] = joint_qd[w * dof_count + i]
    for b in range(body_count):
        X = body_q[w * body_count + b]
        out_body_q[w * body_count + b] = wp.transform(wp.transform_get_translation(X) - s, wp.transform_get_rotation(X))
        out_body_qd[w * body_count + b] = body_qd[w * body_count + b]
    for d in range(3):
        out_offset[w * 3 + d] = offset[w * 3 + d] + s[d]


# -- contacts ---------------------------------------------------------------------------------------


@wp.struct
class ContactSet:
    """The rigid contacts the contact kernels read: a ``newton.Contacts``' arrays (``count`` is
    ``rigid_contact_count``, ``shape0`` ``rigid_contact_shape0``, ...) and the model's ``shape_body``
    (:func:`contact_set`)."""

    shape_body: wp.array(dtype=wp.int32)
    count: wp.array(dtype=wp.int32)
    shape0: wp.array(dtype=wp.int32)
    shape1: wp.array(dtype=wp.int32)
    point0: wp.array(dtype=wp.vec3)
    point1: wp.array(dtype=wp.vec3)
    normal: wp.array(dtype=wp.vec3)
    margin0: wp.array(dtype=wp.float32)
    margin1: wp.array(dtype=wp.float32)


def contact_set(model: newton.Model, contacts: newton.Contacts) -> ContactSet:
    found = ContactSet()
    found.shape_body = model.shape_body
    for name in ("count", "shape0", "shape1", "point0", "point1", "normal", "margin0", "margin1"):
        setattr(found, name, getattr(contacts, f"rigid_contact_{name}"))
    return found


@wp.func
def penetration(body_q: wp.array(dtype=wp.transform), c: ContactSet, i: int) -> float:
    """How deep contact ``i`` is at ``body_q`` [m] (0 when apart): minus the distance newton's contact
    force reads (semi_implicit.kernels_contact: the contact's frozen points and normal)."""
    n = -c.normal[i]
    pa = c.point0[i]
    pb = c.point1[i]
    if c.shape0[i] >= 0:
        body = c.shape_body[c.shape0[i]]
        if body >= 0:
            pa = wp.transform_point(body_q[body], pa)
    if c.shape1[i] >= 0:
        body = c.shape_body[c.shape1[i]]
        if body >= 0:
            pb = wp.transform_point(body_q[body], pb)
    return wp.max(-wp.dot(n, (pa - c.margin0[i] * n) - (pb + c.margin1[i] * n)), 0.0)


@wp.kernel
def mark_contacts(body_q: wp.array(dtype=wp.transform), c: ContactSet, touching: wp.array(dtype=wp.int32)):
    # 1 for every body with a contact of positive depth at body_q (penetration)
    i = wp.tid()
    if i >= c.count[0]:
        return
    if penetration(body_q, c, i) > 0.0:
        if c.shape0[i] >= 0 and c.shape_body[c.shape0[i]] >= 0:
            touching[c.shape_body[c.shape0[i]]] = 1
        if c.shape1[i] >= 0 and c.shape_body[c.shape1[i]] >= 0:
            touching[c.shape_body[c.shape1[i]]] = 1


@wp.kernel
def contact_load(
    body_q: wp.array(dtype=wp.transform),
    c: ContactSet,
    shape_ke: wp.array(dtype=wp.float32),
    body_world: wp.array(dtype=wp.int32),
    per_weight: float,
    load: wp.array(dtype=wp.float32),
):
    # The spring part of contact i's normal force at body_q, ke x depth (ke the mean of its shapes'
    # stiffnesses, as newton's contact kernel takes it), times per_weight (1 / a world's weight),
    # added to the world of the body it pushes (the task=ahac contact signal; no gradient).
    i = wp.tid()
    if i >= c.count[0]:
        return
    depth = penetration(body_q, c, i)
    if depth <= 0.0:
        return
    ke = wp.float32(0.0)
    shapes = wp.float32(0.0)
    body = wp.int32(-1)
    if c.shape0[i] >= 0:
        ke += shape_ke[c.shape0[i]]
        shapes += 1.0
        body = wp.max(body, c.shape_body[c.shape0[i]])
    if c.shape1[i] >= 0:
        ke += shape_ke[c.shape1[i]]
        shapes += 1.0
        body = wp.max(body, c.shape_body[c.shape1[i]])
    if body < 0:
        return
    world = body_world[body]
    if world >= 0:
        wp.atomic_add(load, world, ke / shapes * depth * per_weight)


@wp.kernel
def hunt_crossley(
    body_q: wp.array(dtype=wp.transform),
    body_qd: wp.array(dtype=wp.spatial_vector),
    body_com: wp.array(dtype=wp.vec3),
    c: ContactSet,
    kd_depth: float,
    body_f: wp.array(dtype=wp.spatial_vector),
):
    # The damping force of contact i: kd_depth x depth x closing speed along the normal (Hunt and
    # Crossley 1975; DiffRL's dflex), zero where the contact closes, so the force has no jump there
    # (newton's contact kernel damps by a constant times the speed). Applied to both bodies as
    # wrenches about their centres of mass, in newton's public convention (its contact kernel's
    # frame and signs), so SolverFeatherstone adds it to the contact force it computes.
    i = wp.tid()
    if i >= c.count[0]:
        return
    n = -c.normal[i]
    body_a, body_b = wp.int32(-1), wp.int32(-1)
    if c.shape0[i] >= 0:
        body_a = c.shape_body[c.shape0[i]]
    if c.shape1[i] >= 0:
        body_b = c.shape_body[c.shape1[i]]
    pa = c.point0[i]
    pb = c.point1[i]
    va = wp.vec3(0.0)
    vb = wp.vec3(0.0)
    ra = wp.vec3(0.0)
    rb = wp.vec3(0.0)
    if body_a >= 0:
        X = body_q[body_a]
        pa = wp.transform_point(X, pa) - c.margin0[i] * n
        ra = pa - wp.transform_point(X, body_com[body_a])
        va = wp.spatial_top(body_qd[body_a]) + wp.cross(wp.spatial_bottom(body_qd[body_a]), ra)
    if body_b >= 0:
        X = body_q[body_b]
        pb = wp.transform_point(X, pb) + c.margin1[i] * n
        rb = pb - wp.transform_point(X, body_com[body_b])
        vb = wp.spatial_top(body_qd[body_b]) + wp.cross(wp.spatial_bottom(body_qd[body_b]), rb)
    depth = -wp.dot(n, pa - pb)
    if depth <= 0.0:
        return
    f = n * (wp.min(wp.dot(n, va - vb), 0.0) * kd_depth * depth)
    if body_a >= 0:
        wp.atomic_sub(body_f, body_a, wp.spatial_vector(f, wp.cross(ra, f)))
    if body_b >= 0:
        wp.atomic_add(body_f, body_b, wp.spatial_vector(f, wp.cross(rb, f)))


# -- starts -----------------------------------------------------------------------------------------


@wp.kernel
def draw_starts(
    seed: int,
    key: wp.array(dtype=wp.int32),
    base_q: wp.array(dtype=wp.float32),
    noisy_coords: wp.array(dtype=wp.int32),
    root_free: int,
    root_slides: wp.array(dtype=wp.int32),
    root_hinges: wp.array(dtype=wp.int32),
    coord_count: int,
    dof_count: int,
    position: float,
    rotation: float,
    joint_noise: float,
    velocity: float,
    action_count: int,
    joint_q: wp.array(dtype=wp.float32),
    joint_qd: wp.array(dtype=wp.float32),
    prev_action: wp.array(dtype=wp.float32),
    alive: wp.array(dtype=wp.float32),
):
    # One world's fresh start, seeded by (seed, key[0]) then the world: the draws in a fixed order
    # (position, rotation axis and angle, or the root's slides and hinges; joint coordinates,
    # velocities).
    w = wp.tid()
    stream = wp.rand_init(seed, key[0])
    rng = wp.rand_init(wp.int32(stream), w)
    q0 = w * coord_count
    for c in range(coord_count):
        joint_q[q0 + c] = base_q[c]
    if root_free != 0:
        for d in range(3):
            joint_q[q0 + d] = base_q[d] + wp.randf(rng, -position, position)
        axis = wp.vec3(wp.randf(rng, -0.5, 0.5), wp.randf(rng, -0.5, 0.5), wp.randf(rng, -0.5, 0.5))
        angle = wp.randf(rng, -rotation, rotation)
        turn = wp.quat_from_axis_angle(wp.normalize(axis), angle)
        r = wp.quat(base_q[3], base_q[4], base_q[5], base_q[6]) * turn
        for d in range(4):
            joint_q[q0 + 3 + d] = r[d]
    else:  # a root of slides and hinges (a planar robot's): each coordinate moved as a floating base's
        for i in range(root_slides.shape[0]):
            joint_q[q0 + root_slides[i]] = base_q[root_slides[i]] + wp.randf(rng, -position, position)
        for i in range(root_hinges.shape[0]):
            joint_q[q0 + root_hinges[i]] = base_q[root_hinges[i]] + wp.randf(rng, -rotation, rotation)
    for i in range(noisy_coords.shape[0]):
        c = noisy_coords[i]
        joint_q[q0 + c] = base_q[c] + wp.randf(rng, -joint_noise, joint_noise)
    for d in range(dof_count):
        joint_qd[w * dof_count + d] = wp.randf(rng, -velocity, velocity)
    for i in range(action_count):
        prev_action[w * action_count + i] = 0.0
    alive[w] = 1.0
