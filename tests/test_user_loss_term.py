"""A loss term kind that lives outside this repository: its own module in a temporary folder,
named in a loss config by its dotted path (as an env by its ``_target_``), trained from the
command line; and the ways such a name can be wrong."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from harness.losses import TERM_KINDS, TermKind, WeightedLoss, register_term_kind, term_kind
from tests.helpers import ROOT, run_harness
from tests.test_errors import assert_clean_rejection

MODULE = '''
"""A user's loss term: Huber's penalty (quadratic within 1 of the target, linear beyond)."""
import warp as wp

from harness.losses import TermKind


@wp.func
def _huber(weight: float, diff: float) -> float:
    a = wp.abs(diff)
    if a <= 1.0:
        return weight * 0.5 * diff * diff
    return weight * (a - 0.5)


huber = TermKind("huber", _huber, doc="Huber (1964): 0.5 d^2 within 1, |d| - 0.5 beyond")
not_a_kind = 3
'''

LOSS = """
_target_: harness.losses.WeightedLoss
terms:
  pose:
    source: joint_q
    dim_weights: [0.1, 1.0, 1.0]
    kind: {kind}
"""


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "my_terms.py").write_text(textwrap.dedent(MODULE))
    loss = tmp_path / "configs" / "loss"
    loss.mkdir(parents=True)
    for name, kind in (("huber", "my_terms.huber"), ("squares", "quadratic"), ("typo", "my_terms.hubr")):
        (loss / f"pose_{name}.yaml").write_text(LOSS.format(kind=kind))
    (loss / "pose_wrong_type.yaml").write_text(LOSS.format(kind="my_terms.not_a_kind"))
    (tmp_path / "work").mkdir()
    return tmp_path


def train(folder, *args):
    path = os.pathsep.join([str(folder / "code"), str(ROOT)])
    env = {"HARNESS_CONFIG_PATH": str(folder / "configs"), "PYTHONPATH": path}
    base = ["train", "+env=cartpole", "env.horizon=12", "env.world_count=2", "iterations=2", "log_every=1"]
    return run_harness(*base, *args, cwd=folder / "work", env=env)


@pytest.mark.slow  # default suite time (make test-slow runs it)
def test_a_term_from_outside_the_repository_trains_from_the_command_line(user_folder):
    """The cartpole's pole angles stay within 1 rad over 12 steps, where Huber's penalty is
    exactly half the square: the first iteration's loss is exactly half the quadratic one."""
    huber = train(user_folder, "loss=pose_huber", "hydra.run.dir=huber")
    squares = train(user_folder, "loss=pose_squares", "hydra.run.dir=squares")
    assert huber.returncode == 0, huber.stderr
    assert squares.returncode == 0, squares.stderr
    summary = {
        name: json.loads((user_folder / "work" / name / "summary.json").read_text()) for name in ("huber", "squares")
    }
    assert summary["huber"]["initial_loss"] == 0.5 * summary["squares"]["initial_loss"] > 0


@pytest.mark.parametrize(
    ("loss", "message"),
    [("pose_typo", "cannot import 'my_terms.hubr'"), ("pose_wrong_type", "is a int, not a harness.losses.TermKind")],
    ids=["no_such_name", "not_a_term_kind"],
)
def test_a_term_kind_that_is_not_one_is_refused_in_one_line(user_folder, loss, message):
    proc = train(user_folder, f"loss={loss}")
    assert_clean_rejection(proc, "loss.terms.pose.kind", message, user_folder / "work")


def test_a_kind_registered_by_name_is_found_and_anything_else_is_named_in_the_refusal():
    import warp as wp

    @wp.func
    def absolute(weight: float, diff: float) -> float:
        return weight * wp.abs(diff)

    kind = register_term_kind(TermKind("absolute_test", absolute))
    try:
        assert term_kind("absolute_test", "loss.terms.x.kind") is kind
        assert WeightedLoss({"x": {"source": "joint_q", "kind": "absolute_test"}}).kinds == [kind]
        with pytest.raises(ValueError, match=r"^loss.terms.x.kind: 'absolute' is not a term kind; accepted: "):
            WeightedLoss({"x": {"source": "joint_q", "kind": "absolute"}})
    finally:
        TERM_KINDS.pop("absolute_test")
    with pytest.raises(TypeError, match=r"penalty must be a wp\.func"):
        TermKind("bad", lambda weight, diff: diff)
