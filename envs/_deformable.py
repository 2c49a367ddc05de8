"""What the particle ports (cloth, soft body) share: their observable, the centre of mass of
each world's particles minus the world's target, and the summary line it gives."""

from __future__ import annotations

from typing import Any

from harness.env import Trajectory
from harness.newton_env import NewtonEnv, final_distances


class ComToTarget(NewtonEnv):
    """Writes ``com_to_target`` (the mean of a world's ``config.particles_per_world`` particles
    minus ``self.targets``) and reports its final distance; a base listed before
    :class:`~harness.newton_env.NewtonEnv`."""

    targets: Any

    def write_observables(self, t: int) -> None:
        count = self.config.particles_per_world
        self.write_offset("com_to_target", t, self.targets, per_world=count, count=count)

    def describe(self, trajectory: Trajectory) -> dict[str, Any]:
        return {"final_com_distance_to_target_m": final_distances(trajectory, "com_to_target")}
