"""The commands: one thin module per command of ``python -m harness COMMAND``.

Each module has ``main(args)``: it parses its arguments, loads what it needs, runs it and
prints, and sets the exit code (0 done; 1 a failed check or run; 2 bad input, one line on
stderr; 128 + the signal when interrupted). What two commands share is in
:mod:`harness.commands.common` or in the library below (:mod:`harness.runs`,
:mod:`harness.build`); no library module imports a command (tests/test_architecture.py).
"""

from __future__ import annotations

COMMANDS = {
    "train": "train a simulation:       python -m harness train +env=cartpole [key=value ...]",
    "gradcheck": "tape vs finite diff:      python -m harness gradcheck +env=cartpole env.horizon=120",
    "diagnose": "is the gradient usable:   python -m harness diagnose +env=cartpole",
    "report": "summarise a sweep:        python -m harness report multirun/<sweep>",
    "render": "video and plots of a run: python -m harness render outputs/cartpole/<time>",
    "evaluate": "a checkpoint elsewhere:   python -m harness evaluate outputs/cartpole/<time> env.seed=7",
    "record": "a trajectory for sysid:   python -m harness record +env=cartpole env.pole_masses=[0.3,0.2] out=traj.npz",
    "compile": "kernels ahead of time:    python -m harness compile +env=ant task=shac device=cuda arch=90",
}
"""Every command, with its line of ``python -m harness --help`` (the module is ``harness.commands.<name>``)."""
