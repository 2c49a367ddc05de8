"""Parameter groups: a task that trains two parameter sets, each with its own optimizer, clip
policy, schedule and statistics, on the real cartpole (the cart forces and the pole masses:
control and design at once)."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envs.cartpole import CartpoleEnv
from harness.clip import clip_by_global_norm, no_clip
from harness.config import TrainSettings
from harness.env import Identifiable
from harness.losses import WeightedLoss
from harness.optim import adam, sgd
from harness.params import ParamSpec
from harness.tasks import OpenLoop
from harness.training import Trainer, UpdateRule
from tests.helpers import UPRIGHT_TERMS


class ForcesAndMasses(OpenLoop):
    """Open-loop cart forces (group ``forces``) and the pole masses (group ``masses``)."""

    name = "forces_and_masses"
    roles = (Identifiable,)

    def groups(self, env):
        masses = env.config.quantities()["pole_masses"]
        return {
            "forces": self.parameter_specs(env),
            "masses": [ParamSpec("pole_masses", masses.shape, init=env.quantity_value("pole_masses"), lower=0.05)],
        }

    def group_shapes(self, config):
        return {
            "forces": self.parameter_shapes(config),
            "masses": {"pole_masses": config.quantities()["pole_masses"].shape},
        }

    def bind(self, params):
        self.masses = params["masses"]

    def begin(self, env, params):
        env.set_quantity("pole_masses", self.masses["pole_masses"])
        env.reset()


def make(iterations=4, *, masses_lr=0.05, capture="auto", checkpoint_every=0, resume=None):
    env = CartpoleEnv(horizon=24, world_count=2, device="cpu")
    settings = TrainSettings(
        iterations=iterations,
        log_every=2,
        device="cpu",
        capture=capture,
        plot_every=None,
        checkpoint_every=checkpoint_every,
        resume=resume,
    )
    rules = {"masses": UpdateRule(sgd(masses_lr), clip_by_global_norm(1e-5))}
    return Trainer(
        env, WeightedLoss(UPRIGHT_TERMS), adam(0.5), no_clip(), settings, task=ForcesAndMasses(), rules=rules
    )


def test_each_group_is_updated_by_its_own_rule_from_its_own_gradient():
    trainer = make(capture=False)
    forces, masses = trainer.state.groups["forces"], trainer.state.groups["masses"]
    before = masses.params.data.numpy().copy()
    trainer.step.run()
    grad = masses.grad_pre.numpy()
    norm = float(np.linalg.norm(grad.astype(np.float64)))
    assert norm > 1e-5  # so the masses' clip (1e-5) fires, and the forces' (none) does not
    assert float(masses.stats_pre.norm.numpy()[0]) == pytest.approx(norm, rel=1e-5)
    assert float(masses.stats_post.norm.numpy()[0]) == pytest.approx(1e-5 * norm / (norm + 1e-6), rel=1e-5)
    assert int(masses.substate("clip")["clipped"].numpy()[0]) == 1
    assert int(forces.substate("clip")["clipped"].numpy()[0]) == 0
    # plain SGD on the clipped gradient: p - lr * g * (max_norm / (|g| + 1e-6))
    expected = before - 0.05 * grad * np.float32(1e-5 / (norm + 1e-6))
    np.testing.assert_allclose(masses.params.data.numpy(), expected, rtol=1e-6)
    assert forces.rule.optimizer.name == "adam" and masses.rule.optimizer.name == "sgd"


def test_every_group_logs_its_own_tags_and_the_checkpoint_names_its_arrays(tmp_path):
    trainer = make()
    summary = trainer.fit(tmp_path)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for group in ("forces", "masses"):
        for stat in ("grad_norm_pre", "grad_norm_post", "clip_coef", "clipped", "clipped_fraction", "lr", "param_norm"):
            assert f"optim/{group}/{stat}" in tags, (group, stat)
    assert "optim/grad_norm_pre" not in tags  # a run with several groups names each
    assert [e.value for e in acc.Scalars("optim/masses/clipped_fraction")][-1] == 1.0
    assert summary["groups"]["masses"]["clipped_steps"] == 4 and summary["clipped_steps"] == 0
    arrays = trainer.state.arrays()
    assert {"forces/params/data", "masses/params/data", "masses/optim/step", "forces/optim/exp_avg"} <= set(arrays)
    identity = trainer.step.identity()
    assert identity["groups"]["masses"]["optimizer"] == "sgd" and identity["groups"]["forces"]["optimizer"] == "adam"


def test_a_run_with_two_groups_resumes_bit_for_bit(tmp_path):
    whole = make(iterations=6)
    whole.fit(tmp_path / "whole")
    first = make(iterations=6, checkpoint_every=2)
    first.settings = TrainSettings(**{**first.settings.__dict__, "iterations": 4})
    first.fit(tmp_path / "part")
    resumed = make(iterations=6, resume="auto")
    resumed.fit(tmp_path / "part")
    for key, value in whole.state.arrays().items():
        np.testing.assert_array_equal(value.numpy(), resumed.state.arrays()[key].numpy(), err_msg=key)


def test_a_group_without_a_rule_and_a_rule_without_a_group_are_refused():
    env = CartpoleEnv(horizon=4, world_count=1, device="cpu")
    settings = TrainSettings(iterations=1, device="cpu")
    loss = WeightedLoss(UPRIGHT_TERMS)
    with pytest.raises(ValueError, match="no update rule for parameter group 'masses'"):
        Trainer(env, loss, adam(0.5), no_clip(), settings, task=ForcesAndMasses())
    with pytest.raises(ValueError, match="rules for 'critic'"):
        Trainer(
            env, loss, adam(0.5), no_clip(), settings, task=ForcesAndMasses(), rules={"critic": UpdateRule(sgd(1.0))}
        )
